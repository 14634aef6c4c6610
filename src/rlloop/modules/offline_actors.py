"""Policies of the offline family that SAC's and TD3's do not cover: a categorical policy
(BC on discrete actions) and IQL's Gaussian with a tanh-squashed mean, whose density of a
dataset's action needs no inverse tanh (an action at the box's edge has one)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from rlloop.modules.q_networks import MLP, encode

_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)
#: IQL's log-std bounds (the authors' code).
LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0


class CategoricalPolicy(nn.Module):
    """Logits ``[B, n]`` of ``n`` discrete actions from observations ``[B, *obs]``."""

    def __init__(self, obs_dim: int, n_actions: int, hidden: Sequence[int]) -> None:
        super().__init__()
        self.net = MLP(obs_dim, hidden, n_actions)

    def forward(self, obs: Tensor) -> Tensor:
        return self.net(encode(None, obs, self.net.dtype))


class TanhMeanGaussianActor(nn.Module):
    """``a ~ N(tanh(mu(s)), sigma^2)`` with a state-independent ``log sigma`` (clamped to
    ``[-5, 2]``): IQL's policy (Kostrikov et al. 2021, the authors' code). Its mode
    ``tanh(mu(s))`` lies in ``[-1, 1]^d``; samples are clipped there when acting."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: Sequence[int]) -> None:
        super().__init__()
        self.act_dim = act_dim
        self.net = MLP(obs_dim, hidden, act_dim)
        self.log_std = nn.Parameter(torch.zeros(act_dim))

    def mode(self, obs: Tensor) -> Tensor:
        """``tanh(mu(s))`` ``[B, d]``."""
        return torch.tanh(self.net(encode(None, obs, self.net.dtype)))

    def std(self) -> Tensor:
        return self.log_std.clamp(LOG_STD_MIN, LOG_STD_MAX).exp()

    def log_prob(self, obs: Tensor, action: Tensor) -> Tensor:
        """``log pi(a|s)`` ``[B]`` of actions ``[B, d]``."""
        log_std = self.log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)
        z = (action - self.mode(obs)) / log_std.exp()
        return (-0.5 * z.square() - log_std).sum(-1) - self.act_dim * _LOG_SQRT_2PI

    def sample(self, obs: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """A sample ``[B, d]`` clipped to ``[-1, 1]``."""
        mean = self.mode(obs)
        noise = torch.randn(mean.shape, generator=generator, device=mean.device,
                            dtype=mean.dtype)
        return (mean + noise * self.std()).clamp(-1.0, 1.0)
