"""An actor-critic for observations that end with a legal-action mask (board games,
envs with ``info["action_mask"]``; see :mod:`rlloop.envs.action_masks`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from rlloop.envs.action_masks import ILLEGAL_LOGIT, legal_actions, mask_scores
from rlloop.envs.core import Discrete
from rlloop.errors import ConfigError
from rlloop.modules.actor_critic import ActorCritic
from rlloop.modules.distributions import ActionDist, Categorical
from rlloop.modules.encoders import DictEncoder
from rlloop.modules.networks import run_layers

__all__ = ["ILLEGAL_LOGIT", "MaskedActorCritic", "random_legal_actions"]


def random_legal_actions(legal: Tensor, generator: torch.Generator | None) -> Tensor:
    """``[B]`` int64, uniformly random among each row's legal actions."""
    return Categorical(mask_scores(torch.zeros(legal.shape, device=legal.device),
                                   legal)).sample(generator)


class MaskedActorCritic(ActorCritic):
    """:class:`ActorCritic` whose last ``mask_dims`` observation features mark legal actions.

    The mask applies wherever the policy is read (acting, and the loss through
    ``dist_value``), so the log-probabilities of the loss match the ones acted with.
    With a :class:`DictEncoder` (a Dict observation whose ``action_mask`` entry the env
    layer appended) the encoder reads the entries only and the mask comes from the
    observation's tail.
    """

    def __init__(self, obs_shape: Sequence[int], action_space: Discrete, mask_dims: int,
                 hidden: Sequence[int] = (64, 64), activation: str = "tanh",
                 **kwargs: Any) -> None:
        if not isinstance(action_space, Discrete) or action_space.n != mask_dims:
            raise TypeError(f"an action mask of {mask_dims} needs Discrete({mask_dims}) actions")
        super().__init__(obs_shape, action_space, hidden, activation, **kwargs)
        if self.net_input is not None or not isinstance(self.encoder, DictEncoder | None):
            raise ConfigError("action masking needs the MLP on flat observations; drop the "
                              "custom net / encoder or set action_mask=false")
        self.mask_dims = mask_dims

    def dist(self, obs: Tensor) -> ActionDist:
        return self._masked(self.features(obs), obs)

    def dist_value(self, obs: Tensor) -> tuple[ActionDist, Tensor]:
        x = self.features(obs)
        return self._masked(x, obs), run_layers(self.critic, x).squeeze(-1)

    def _masked(self, x: Tensor, obs: Tensor) -> ActionDist:
        return Categorical(mask_scores(run_layers(self.actor, x), legal_actions(obs.flatten(1),
                                                                    self.mask_dims)))
