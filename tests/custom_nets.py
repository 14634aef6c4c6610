"""User networks for tests/test_custom_net.py, as a user would write them: a class
``Net(obs_shape)`` mapping observations to ``features_dim`` features."""

from __future__ import annotations

import math
from typing import ClassVar

import torch
from torch import Tensor, nn


class TinyEncoder(nn.Module):
    """Two tanh layers of 64 on the flattened observation."""

    def __init__(self, obs_shape: tuple[int, ...]) -> None:
        super().__init__()
        self.features_dim = 64
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(math.prod(obs_shape), 64), nn.Tanh(),
                                 nn.Linear(64, 64), nn.Tanh())

    def forward(self, obs: Tensor) -> Tensor:
        return self.net(obs)


class NoFeaturesDim(nn.Module):
    """Forgets to say how many features it makes."""

    def __init__(self, obs_shape: tuple[int, ...]) -> None:
        super().__init__()
        self.net = nn.Linear(math.prod(obs_shape), 8)

    def forward(self, obs: Tensor) -> Tensor:
        return self.net(obs)


class SeesInput(nn.Module):
    """Records what it is given (dtype, shape, largest value), on the flattened input."""

    seen: ClassVar[list[tuple[torch.dtype, tuple[int, ...], float]]] = []

    def __init__(self, obs_shape: tuple[int, ...]) -> None:
        super().__init__()
        self.features_dim = 8
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(math.prod(obs_shape), 8))

    def forward(self, obs: Tensor) -> Tensor:
        SeesInput.seen.append((obs.dtype, tuple(obs.shape), float(obs.max())))
        return self.net(obs)


class WrongDim(nn.Module):
    """Makes 32 features but says 16."""

    def __init__(self, obs_shape: tuple[int, ...]) -> None:
        super().__init__()
        self.features_dim = 16
        self.net = nn.Linear(math.prod(obs_shape), 32)

    def forward(self, obs: Tensor) -> Tensor:
        return self.net(obs.flatten(1))


class WrongInput(nn.Module):
    """Its first layer expects 5 inputs, whatever the observation."""

    def __init__(self, obs_shape: tuple[int, ...]) -> None:
        super().__init__()
        self.features_dim = 8
        self.net = nn.Linear(5, 8)

    def forward(self, obs: Tensor) -> Tensor:
        return self.net(obs)


class LazyEncoder(nn.Module):
    """Its first layer learns its input size at the first forward pass."""

    def __init__(self, obs_shape: tuple[int, ...]) -> None:
        super().__init__()
        self.features_dim = 16
        self.net = nn.Sequential(nn.Flatten(), nn.LazyLinear(16), nn.Tanh())

    def forward(self, obs: Tensor) -> Tensor:
        return self.net(obs)


def feature_count(obs_shape: tuple[int, ...]) -> int:
    """A factory function that returns no network (a number)."""
    return math.prod(obs_shape)
