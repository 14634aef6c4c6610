"""User networks for tests/test_custom_net.py, as a user would write them: a class
``Net(obs_shape)`` mapping observations to ``features_dim`` features."""

from __future__ import annotations

import math

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
