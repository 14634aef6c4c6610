"""VecEnv wrappers that change what the learner sees."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from rlloop.envs.core import EnvSpec, StepResult, VecEnv
from rlloop.envs.normalizer import RunningMeanStd


class NormalizeObservation:
    """Standardises observations with running statistics shared with an eval env.

    The training env updates ``stats``; an eval env made with ``update=False`` reads
    the same object, so evaluation sees what the policy was trained on.
    """

    def __init__(self, env: VecEnv, stats: RunningMeanStd, update: bool = True) -> None:
        self.env = env
        self.stats = stats
        self.update = update
        self.num_envs: int = env.num_envs
        self.spec: EnvSpec = env.spec

    def reset(self, seed: int | None = None) -> Tensor:
        obs = self.env.reset(seed=seed)
        if self.update:
            self.stats.update(obs)
        return self.stats.normalize(obs)

    def step(self, actions: Tensor) -> StepResult:
        res = self.env.step(actions)
        if self.update:
            self.stats.update(res.obs)
        obs = self.stats.normalize(res.obs)
        final = obs if res.final_obs is res.obs else self.stats.normalize(res.final_obs)
        return StepResult(obs, res.reward, res.terminated, res.truncated, final)

    def get_state(self) -> dict[str, Any]:
        return self.env.get_state()

    def set_state(self, state: dict[str, Any]) -> None:
        self.env.set_state(state)

    def close(self) -> None:
        self.env.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)


def discounted_reward_scale(rewards: Tensor, dones: Tensor, running: Tensor,
                            stats: RunningMeanStd, gamma: float) -> Tensor:
    """Divide rewards ``[T, N]`` by the running std of the discounted return.

    ``running`` ``[N]`` carries the discounted return across calls and is updated in
    place (Engstrom et al., 2020, "Implementation Matters in Deep RL").
    """
    for t in range(rewards.shape[0]):
        running.mul_(gamma).add_(rewards[t].to(running.dtype))
        stats.update(running)
        running.masked_fill_(dones[t], 0.0)
    return rewards / torch.sqrt(stats.var.to(rewards.dtype) + stats.eps)
