"""Observation and reward normalisation for a replay buffer, applied when a batch is drawn.

The replay keeps the env's raw observations and rewards; a sampled batch is standardised
with the statistics as they are at sampling time (what SB3's replay buffers do with a
``VecNormalize`` env). Normalising at store time instead froze each row with the
statistics of its own step, and the rows stay for the whole run. On Pendulum-v1 (one env)
the reward scale, one over the return's running std, was 6223 at the first step, 0.1 at
the tenth, 0.014 at the hundredth and 0.006 from the thousandth on: the first ten rows
held rewards 17 to a million times larger than the same rewards stored later (the
hundredth twice as large), and the first observations, standardised by one or two
samples, were stored as 0 and +-1. SAC then did not learn Pendulum-v1 with either
normalisation on (-1180 after 20k steps).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import Tensor

from rlloop.data.transitions import Transitions
from rlloop.envs.normalizer import RunningMeanStd


class ReplayNormalizer:
    """Running statistics of observations and of the discounted return, and the batches
    standardised with them.

    Args:
        num_envs: Envs stepped together (one running discounted return each).
        gamma: The discount of the return whose std scales rewards.
        obs_stats: The observation statistics (shared with the eval envs, ``predict`` and
            checkpoints), or None to leave observations as they are.
        normalize_rewards: Scale rewards by the running std of the discounted return.
        device: Where the statistics live.
    """

    def __init__(
        self,
        num_envs: int,
        gamma: float,
        obs_stats: RunningMeanStd | None,
        normalize_rewards: bool,
        device: torch.device | str = "cpu",
    ) -> None:
        self.gamma = gamma
        self.obs_stats = obs_stats
        self.reward_stats = RunningMeanStd(device=device) if normalize_rewards else None
        #: Each env's running discounted return, in the statistics' dtype.
        self.running = torch.zeros(
            num_envs,
            device=device,
            dtype=self.reward_stats.dtype if self.reward_stats else torch.float64,
        )

    def observe(self, reward: Tensor, done: Tensor, next_obs: Tensor) -> None:
        """Fold one batched env step into the statistics: ``reward`` and ``done`` ``[N]``
        (a done env's return restarts), ``next_obs`` ``[N, *obs]`` (after auto-reset, the
        next episode's first observation, as VecNormalize sees it)."""
        if self.obs_stats is not None:
            self.obs_stats.update(next_obs)
        if self.reward_stats is not None:
            self.running.mul_(self.gamma).add_(reward.to(self.running.dtype))
            self.reward_stats.update(self.running)
            self.running.masked_fill_(done, 0.0)

    def policy_obs(self, obs: Tensor) -> Tensor:
        """``obs`` ``[N, *obs]`` as the policy takes it."""
        return obs if self.obs_stats is None else self.obs_stats.normalize(obs)

    def batch(self, t: Transitions) -> Transitions:
        """A sampled batch standardised with the current statistics: both observations
        alike, and rewards (an n-step sum too, linearly) divided by the return's std and
        clipped at +-10 as VecNormalize clips them."""
        if self.obs_stats is None and self.reward_stats is None:
            return t
        changes: dict[str, Tensor] = {}
        if self.obs_stats is not None:
            changes["obs"] = self.obs_stats.normalize(t.obs)
            changes["next_obs"] = self.obs_stats.normalize(t.next_obs)
        if (stats := self.reward_stats) is not None:
            std = torch.sqrt(stats.var.to(t.reward.dtype) + stats.eps)
            changes["reward"] = (t.reward / std).clamp(-stats.clip, stats.clip)
        return dataclasses.replace(t, **changes)

    def get_state(self) -> dict[str, Any] | None:
        """The return's statistics and running returns (the observation statistics are
        the algorithm's to save); None without reward normalisation."""
        if self.reward_stats is None:
            return None
        return {**self.reward_stats.get_state(), "running": self.running.clone()}

    def set_state(self, state: dict[str, Any] | None) -> None:
        if self.reward_stats is not None and state is not None:
            self.reward_stats.set_state(state)
            self.running.copy_(state["running"])
