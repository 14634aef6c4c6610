"""A goal-conditioned env's reward function as a batched tensor function.

Gymnasium-Robotics' goal envs (Fetch, ...) and the ``GoalEnv`` convention give a Dict
observation with ``achieved_goal`` and ``desired_goal`` entries and a method
``compute_reward(achieved_goal, desired_goal, info)`` that scores batches of goals (numpy
arrays ``[B, G]`` in, ``[B]`` out). Hindsight replay calls it on relabelled goals; this
module finds it on the env and wraps it for tensors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor

from rlloop.envs.gym import find_gym_env
from rlloop.errors import ConfigError


def goal_reward(env: Any, section: str) -> Callable[[Tensor, Tensor], Tensor]:
    """``env``'s ``compute_reward`` over tensors: ``(achieved [B, G], desired [B, G]) ->
    [B]`` float32 on their device. It is called with an empty ``info`` per row (as
    Stable-Baselines3 does by default), so a reward that reads ``info`` is not supported.

    Raises:
        ConfigError: ``env`` is no Gymnasium env, or has no batched ``compute_reward``.
    """
    gym_env = find_gym_env(env)
    one = gym_env.one_env().unwrapped if gym_env is not None else None
    compute = getattr(one, "compute_reward", None)
    if not callable(compute):
        raise ConfigError(f"{section}.replay=her recomputes rewards for new goals with the "
                          f"env's compute_reward(achieved_goal, desired_goal, info), which "
                          f"{env.spec.env_id} lacks; give the env that method or use "
                          f"{section}.replay=uniform")

    def reward(achieved: Tensor, desired: Tensor) -> Tensor:
        infos: list[dict[str, Any]] = [{} for _ in range(len(achieved))]
        out = compute(achieved.cpu().numpy(), desired.cpu().numpy(), infos)
        return torch.as_tensor(np.asarray(out, dtype=np.float32)).to(achieved.device)

    probe = torch.zeros((2, *_goal_shape(env)), device="cpu")
    try:
        got = tuple(reward(probe, probe).shape)
    except Exception as e:
        got = f"{type(e).__name__}: {e}"  # type: ignore[assignment]
    if got != (2,):
        raise ConfigError(f"{section}.replay=her calls {env.spec.env_id}'s compute_reward on "
                          f"batches of goals ([B, G] arrays, returning [B]), and for B=2 it "
                          f"gave {got}; make it vectorised, as Gymnasium-Robotics' are")
    return reward


def _goal_shape(env: Any) -> tuple[int, ...]:
    parts = {key: shape for key, shape, _ in env.spec.obs_parts}
    return parts["achieved_goal"]
