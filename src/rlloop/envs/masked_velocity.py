"""Masked-velocity CartPole for Gymnasium: position and angle only, a task that needs memory.

The native backend has the same task as ``CartPole-v1`` with ``env_kwargs.mask_velocity``
(``--set env.mask_velocity=true``). For Gymnasium (its backends, or another library such
as Stable-Baselines3) this module gives the :class:`MaskVelocity` wrapper and registers
``MaskedVelocityCartPole-v1`` when imported, so ``--env
rlloop.envs.masked_velocity:MaskedVelocityCartPole-v1 --backend gymnasium`` trains on it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

ENV_ID = "MaskedVelocityCartPole-v1"
#: CartPole's observation is (x, x_dot, theta, theta_dot): keep x and theta.
CARTPOLE_POSITIONS = (0, 2)


class MaskVelocity(gymnasium.ObservationWrapper[np.ndarray, Any, np.ndarray]):
    """Keeps the observation entries ``keep`` of a flat ``Box`` observation."""

    def __init__(self, env: gymnasium.Env[np.ndarray, Any],
                 keep: Sequence[int] = CARTPOLE_POSITIONS) -> None:
        super().__init__(env)
        space = env.observation_space
        if not isinstance(space, gymnasium.spaces.Box) or len(space.shape) != 1:
            raise ValueError(f"MaskVelocity needs a flat Box observation space, got {space}")
        self._keep = np.asarray(keep, dtype=np.int64)
        self.observation_space = gymnasium.spaces.Box(
            space.low[self._keep], space.high[self._keep], dtype=space.dtype)  # type: ignore[arg-type]

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return observation[self._keep]


def make_masked_cartpole(**kwargs: Any) -> MaskVelocity:
    """CartPole-v1's env (kwargs as for it) with the velocities masked."""
    return MaskVelocity(CartPoleEnv(**kwargs))


if ENV_ID not in gymnasium.registry:
    gymnasium.register(ENV_ID, entry_point=make_masked_cartpole, max_episode_steps=500,
                       reward_threshold=475.0)
