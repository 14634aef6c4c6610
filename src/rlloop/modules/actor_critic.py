"""The actor-critic module used by PPO: separate MLPs for policy and value."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from rlloop.envs.core import ActionSpace, Box, Discrete, MultiBinary, MultiDiscrete
from rlloop.modules.distributions import (
    ActionDist,
    Bernoulli,
    Categorical,
    DiagGaussian,
    MultiCategorical,
)
from rlloop.modules.encoders import NatureCNN
from rlloop.modules.networks import flat_dim, mlp


class ActorCritic(nn.Module):
    """Policy ``pi(a|s)`` and value ``V(s)`` for a Discrete, Box, MultiDiscrete (one
    categorical head per entry) or MultiBinary (one Bernoulli per entry) action space.

    Observations ``[B, *obs_shape]`` are flattened, or go through ``encoder`` (a CNN for
    pixels, shared by policy and value as in Stable-Baselines3's ``CnnPolicy``; the heads
    are then linear on its features and ``hidden`` is unused). Box actions use a
    state-independent learned ``log_std``; the environment adapter clips actions to the
    bounds.
    """

    def __init__(
        self,
        obs_shape: Sequence[int],
        action_space: ActionSpace,
        hidden: Sequence[int] = (64, 64),
        activation: str = "tanh",
        init_log_std: float = 0.0,
        encoder: NatureCNN | None = None,
    ) -> None:
        super().__init__()
        self.encoder = encoder
        self.obs_dim = flat_dim(obs_shape) if encoder is None else encoder.out_dim
        if encoder is not None:
            hidden = ()
        self.action_space = action_space
        if isinstance(action_space, Discrete | MultiDiscrete | MultiBinary):
            out = action_space.n
        elif isinstance(action_space, Box):
            out = action_space.dim
            self.log_std = nn.Parameter(torch.full((out,), float(init_log_std)))
        else:  # pragma: no cover - the env layer rejects other spaces first
            raise TypeError(f"unsupported action space {action_space!r}")
        self.actor = mlp(self.obs_dim, hidden, out, activation=activation, out_gain=0.01)
        self.critic = mlp(self.obs_dim, hidden, 1, activation=activation, out_gain=1.0)

    def features(self, obs: Tensor) -> Tensor:
        """``[B, obs_dim]``: the flattened observation or the encoder's features."""
        return obs.flatten(1) if self.encoder is None else self.encoder(obs)

    def dist(self, obs: Tensor) -> ActionDist:
        return self._dist(self.features(obs))

    def _dist(self, features: Tensor) -> ActionDist:
        out = self.actor(features)
        space = self.action_space
        if isinstance(space, Discrete):
            return Categorical(out)
        if isinstance(space, MultiDiscrete):
            return MultiCategorical(out, space.nvec)
        if isinstance(space, MultiBinary):
            return Bernoulli(out)
        return DiagGaussian(out, self.log_std)

    def value(self, obs: Tensor) -> Tensor:
        return self.critic(self.features(obs)).squeeze(-1)

    def dist_value(self, obs: Tensor) -> tuple[ActionDist, Tensor]:
        """``dist(obs)`` and ``value(obs)`` with one encoder pass."""
        x = self.features(obs)
        return self._dist(x), self.critic(x).squeeze(-1)

    def act(self, obs: Tensor, deterministic: bool = False,
            generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """Actions and their log-probabilities for ``obs`` ``[B, *obs]``."""
        d = self.dist(obs)
        actions = d.mode() if deterministic else d.sample(generator)
        if isinstance(self.action_space, Box):
            actions = actions.reshape(-1, *self.action_space.shape)
        return actions, d.log_prob(actions.flatten(1) if actions.dim() > 1 else actions)
