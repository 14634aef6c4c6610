"""The algorithm side of border's cadence, shared by DQN, SAC and TD3.

:class:`OffPolicyAlgorithmBase` turns a learner, an :class:`OffPolicyLoop` and a
behaviour policy (``_explore``) into what :class:`~rlloop.offpolicy_trainer.
OffPolicyTrainer` drives (``env_step``, ``optimize``, ``episode_stats``) and what the
plain :class:`~rlloop.trainer.Trainer` drives (``collect``, ``update``), with the state
every off-policy algorithm checkpoints. Subclasses build ``config``, ``learner`` and
``loop`` in ``__init__`` and implement ``_explore`` and ``act``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import torch
from torch import Tensor

from rlloop.algorithms.base import EVAL_SEED_OFFSET, AlgorithmBase, EnvSettings
from rlloop.algorithms.offpolicy import (
    OffPolicyConfig,
    OffPolicyLoop,
    ReplayBatch,
    Stats,
    box_rescaler,
    check_env_settings,
)
from rlloop.envs.core import Box
from rlloop.errors import ConfigError


class OffPolicyLearner(Protocol):
    """What the shared glue needs from DQN's, SAC's and TD3's learners."""

    updates: int
    skipped_updates: int

    def update(self, batch: ReplayBatch) -> dict[str, Tensor]: ...
    def before_gradient_based_update(self, env_steps: int) -> object: ...
    def after_gradient_based_update(self) -> None: ...
    def get_state(self) -> dict[str, Any]: ...
    def set_state(self, state: Mapping[str, Any]) -> None: ...


class OffPolicyAlgorithmBase(AlgorithmBase):
    """Border's env step and optimisation step, rl8's collect and update, and the state.

    Args:
        section: The config section (``"dqn"``...), for error messages.
        env: The env settings.
    """

    config: OffPolicyConfig
    learner: OffPolicyLearner
    loop: OffPolicyLoop

    def __init__(self, section: str, env: EnvSettings) -> None:
        check_env_settings(section, env.horizons_per_env_reset)
        super().__init__(env)
        #: Stochastic evaluation's own RNG: evaluating never shifts training's draws.
        self._eval_generator = torch.Generator().manual_seed(env.seed + EVAL_SEED_OFFSET)

    def _explore(self, obs: Tensor) -> Tensor:
        """The behaviour policy after warm-up: ``obs [N, ...] -> actions [N, ...]``."""
        raise NotImplementedError

    # ---- border's cadence ------------------------------------------------------------
    def env_step(self) -> int:
        return self.loop.env_step(self._explore)

    def optimize(self, env_steps: int) -> dict[str, Tensor | float] | None:
        """One optimisation step (``gradient_steps`` updates); None during warm-up."""
        if not self.loop.learning(env_steps):
            return None
        self.learner.before_gradient_based_update(env_steps)
        stats = self._optimize(env_steps)
        self.learner.after_gradient_based_update()
        return {**(stats or {}), **self._extra_stats(env_steps),
                "guard/skipped_updates": float(self.learner.skipped_updates)}

    def _optimize(self, env_steps: int) -> Mapping[str, Tensor] | None:
        return self.loop.optimize(env_steps, self._update)

    def _update(self, batch: ReplayBatch, rows: Tensor | None) -> dict[str, Tensor]:
        return self.learner.update(batch)

    def _extra_stats(self, env_steps: int) -> dict[str, float]:
        return {}

    def episode_stats(self) -> Stats:
        return self.runner.episodes.stats()

    # ---- rl8's collect / update (plain Trainer) --------------------------------------
    def collect(self) -> Stats:
        return self.loop.collect(self._explore)

    def update(self, env_steps: int) -> Stats:
        return self.loop.update(env_steps, self.optimize)

    # ---- state -----------------------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        return {**super().get_state(), "learner": self.learner.get_state(),
                "offpolicy": self.loop.get_state(), "updates": self.learner.updates,
                "eval_generator": self._eval_generator.get_state()}

    def set_state(self, state: dict[str, Any]) -> None:
        super().set_state(state)
        self.learner.set_state(state["learner"])
        self.loop.set_state(state["offpolicy"])
        self.learner.updates = int(state["updates"])
        self._eval_generator.set_state(state["eval_generator"])


def continuous_actions(section: str, env: EnvSettings) -> tuple[Box, Callable[[Tensor], Tensor]]:
    """The env's Box action space and the map from ``[-1, 1]`` to its bounds.

    Raises:
        ConfigError: discrete actions, or an unbounded box.
    """
    space = env.spec.action_space
    if not isinstance(space, Box):
        raise ConfigError(f"{section} needs continuous (Box) actions but {env.env_id} has "
                          "discrete ones; use dqn or ppo")
    return space, box_rescaler(section, space)
