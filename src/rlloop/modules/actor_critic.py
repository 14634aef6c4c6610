"""The actor-critic module used by PPO: separate MLPs for policy and value."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from rlloop.envs.core import ActionSpace, Box, Discrete
from rlloop.modules.distributions import ActionDist, Categorical, DiagGaussian
from rlloop.modules.networks import flat_dim, mlp


class ActorCritic(nn.Module):
    """Policy ``pi(a|s)`` and value ``V(s)`` for a Discrete or Box action space.

    Observations ``[B, *obs_shape]`` are flattened. Box actions use a state-independent
    learned ``log_std``; the environment adapter clips actions to the bounds.
    """

    def __init__(
        self,
        obs_shape: Sequence[int],
        action_space: ActionSpace,
        hidden: Sequence[int] = (64, 64),
        activation: str = "tanh",
        init_log_std: float = 0.0,
    ) -> None:
        super().__init__()
        self.obs_dim = flat_dim(obs_shape)
        self.action_space = action_space
        if isinstance(action_space, Discrete):
            out = action_space.n
        elif isinstance(action_space, Box):
            out = action_space.dim
            self.log_std = nn.Parameter(torch.full((out,), float(init_log_std)))
        else:  # pragma: no cover - the env layer rejects other spaces first
            raise TypeError(f"unsupported action space {action_space!r}")
        self.actor = mlp(self.obs_dim, hidden, out, activation=activation, out_gain=0.01)
        self.critic = mlp(self.obs_dim, hidden, 1, activation=activation, out_gain=1.0)

    def dist(self, obs: Tensor) -> ActionDist:
        out = self.actor(obs.flatten(1))
        if isinstance(self.action_space, Discrete):
            return Categorical(out)
        return DiagGaussian(out, self.log_std)

    def value(self, obs: Tensor) -> Tensor:
        return self.critic(obs.flatten(1)).squeeze(-1)

    def act(self, obs: Tensor, deterministic: bool = False,
            generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """Actions and their log-probabilities for ``obs`` ``[B, *obs]``."""
        d = self.dist(obs)
        actions = d.mode() if deterministic else d.sample(generator)
        if isinstance(self.action_space, Box):
            actions = actions.reshape(-1, *self.action_space.shape)
        return actions, d.log_prob(actions.flatten(1) if actions.dim() > 1 else actions)
