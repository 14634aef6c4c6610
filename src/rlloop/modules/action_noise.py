"""Action noise for deterministic actors (TD3): Gaussian and Ornstein-Uhlenbeck.

Both act on the normalised action box ``[-1, 1]^d``, batched over ``N`` envs, and draw
from the algorithm's generator on its device. The Ornstein-Uhlenbeck process keeps one
state per env, restarted at 0 where that env's episode ended (Stable-Baselines3's
``VectorizedActionNoise.reset(indices)``); the restart is a masked fill on the device,
so no step waits for the host to learn which episodes ended.

The OU process is Stable-Baselines3's Euler-Maruyama step (``common/noise.py``)::

    x_t = x_{t-1} + theta * (mu - x_{t-1}) * dt + sigma * sqrt(dt) * N(0, 1),   mu = 0
"""

from __future__ import annotations

import math
from typing import Any, Literal, Protocol

import torch
from torch import Tensor

NoiseKind = Literal["normal", "ornstein_uhlenbeck", "none"]


class ActionNoise(Protocol):
    """``sample() -> [N, d]`` noise; ``episode_end(done [N])`` restarts finished envs."""

    def sample(self) -> Tensor: ...
    def episode_end(self, done: Tensor) -> None: ...
    def get_state(self) -> dict[str, Any]: ...
    def set_state(self, state: dict[str, Any]) -> None: ...


class _Memoryless:
    """Noise without state across steps: nothing to reset at episode ends or to save."""

    def episode_end(self, done: Tensor) -> None:
        pass

    def get_state(self) -> dict[str, Any]:
        return {}

    def set_state(self, state: dict[str, Any]) -> None:
        pass


class NoNoise(_Memoryless):
    """Zero noise: the actor's own action (``action_noise=none``)."""

    def __init__(self, shape: tuple[int, int], device: torch.device) -> None:
        self._zeros = torch.zeros(shape, device=device)

    def sample(self) -> Tensor:
        return self._zeros


class GaussianNoise(_Memoryless):
    """Independent ``N(0, std^2)`` per env, step and action dimension."""

    def __init__(self, shape: tuple[int, int], std: float, generator: torch.Generator) -> None:
        self.shape, self.std, self.generator = shape, std, generator

    def sample(self) -> Tensor:
        eps = torch.randn(self.shape, generator=self.generator, device=self.generator.device)
        return eps.mul_(self.std)


class OrnsteinUhlenbeckNoise(GaussianNoise):
    """Temporally correlated noise: one OU process per env and action dimension, with
    ``sigma = std`` and mean 0."""

    def __init__(self, shape: tuple[int, int], std: float, generator: torch.Generator,
                 theta: float = 0.15, dt: float = 1e-2) -> None:
        super().__init__(shape, std, generator)
        self.theta, self.dt = theta, dt
        self.state = torch.zeros(shape, device=generator.device)

    def sample(self) -> Tensor:
        eps = torch.randn(self.shape, generator=self.generator, device=self.generator.device)
        self.state.add_(self.state, alpha=-self.theta * self.dt)
        self.state.add_(eps, alpha=self.std * math.sqrt(self.dt))
        return self.state.clone()

    def episode_end(self, done: Tensor) -> None:
        self.state.masked_fill_(done.view(-1, 1), 0.0)

    def get_state(self) -> dict[str, Any]:
        return {"state": self.state.clone()}

    def set_state(self, state: dict[str, Any]) -> None:
        if "state" in state:  # absent in checkpoints from before OU noise existed
            self.state.copy_(state["state"])


def make_action_noise(kind: NoiseKind, num_envs: int, act_dim: int, std: float,
                      generator: torch.Generator, theta: float = 0.15, dt: float = 1e-2
                      ) -> ActionNoise:
    """The noise process ``kind`` for ``num_envs`` envs of ``act_dim`` actions."""
    shape = (num_envs, act_dim)
    if kind == "normal":
        return GaussianNoise(shape, std, generator)
    if kind == "ornstein_uhlenbeck":
        return OrnsteinUhlenbeckNoise(shape, std, generator, theta, dt)
    return NoNoise(shape, generator.device)
