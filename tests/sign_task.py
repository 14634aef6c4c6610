"""A tiny task for the task-API tests: learn to copy the sign of the observation."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch
from torch import Tensor, nn
from worker_envs import SignEnv

from rlloop.tasks import Sample, Task, TaskConfig


@dataclass(frozen=True)
class SignSample:
    obs: np.ndarray
    action: np.int64
    advantage: np.float32


class SignTask(Task[nn.Module]):
    """Policy gradient with advantage ``reward - 0.5`` (a random policy's mean reward)."""

    def __init__(self, config: TaskConfig, env_fn: Callable[[], Any] = SignEnv) -> None:
        super().__init__(config)
        self.env_fn = env_fn

    def get_environment(self) -> Any:
        return self.env_fn()

    def environment_factory(self) -> Callable[[], Any]:
        return self.env_fn

    def get_actions(self, model: nn.Module, states: Tensor, optimal: bool) -> Tensor:
        logits = model(states)
        if optimal:
            return logits.argmax(-1)
        # Gumbel-max: unlike torch.distributions it tolerates NaN observations.
        return (logits - torch.empty_like(logits).exponential_().log()).argmax(-1)

    def postprocess_trajectory(self, trajectory: list[Sample]) -> list[Any]:
        return [SignSample(s.obs, np.int64(s.action), np.float32(s.reward - 0.5))
                for s in trajectory]

    def run_model(self, model: nn.Module, batch: SignSample) -> Tensor:
        return torch.log_softmax(model(batch.obs), -1)

    def compute_loss(self, model: nn.Module, batch: SignSample, output: Tensor) -> Any:
        # the dataset collates each field of the samples into a tensor, on the model's device
        action, advantage = cast(Tensor, batch.action), cast(Tensor, batch.advantage)
        log_prob = output.gather(-1, action.long()[:, None]).squeeze(-1)
        return {"policy": -(log_prob * advantage).mean()}


def sign_policy() -> nn.Module:
    model = nn.Linear(1, 2)
    nn.init.zeros_(model.weight)
    nn.init.zeros_(model.bias)
    return model  # starts as the uniform random policy (mean return 5 of 10)


def learned(model: nn.Module) -> float:
    """Mean return of the deterministic policy on 10 fault-free episodes."""
    return SignTask(TaskConfig()).evaluate(model, episodes=10)["return_mean"]


def params_finite(model: nn.Module) -> bool:
    return all(bool(torch.isfinite(p).all()) for p in model.parameters())
