"""An actor-critic for observations that end with a legal-action mask (board games)."""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor

from rlloop.envs.core import Discrete
from rlloop.modules.actor_critic import ActorCritic
from rlloop.modules.distributions import ActionDist, Categorical

#: Logit of an illegal action: finite, so that ``p * log p`` is 0, not NaN, in the entropy.
ILLEGAL_LOGIT = -1e9


class MaskedActorCritic(ActorCritic):
    """:class:`ActorCritic` whose last ``mask_dims`` observation features mark legal actions.

    Keeping the mask inside the observation lets the learner, the rollout and the PPO loss
    stay unchanged: the mask travels with each sample. A row whose mask is all zero (the
    agent is not to move) gets every action, since that action is ignored anyway.
    """

    def __init__(self, obs_shape: Sequence[int], action_space: Discrete, mask_dims: int,
                 hidden: Sequence[int] = (64, 64), activation: str = "tanh") -> None:
        if not isinstance(action_space, Discrete) or action_space.n != mask_dims:
            raise TypeError(f"an action mask of {mask_dims} needs Discrete({mask_dims}) actions")
        super().__init__(obs_shape, action_space, hidden, activation)
        self.mask_dims = mask_dims

    def dist(self, obs: Tensor) -> ActionDist:
        flat = obs.flatten(1)
        legal = flat[:, -self.mask_dims:] > 0
        legal = legal | ~legal.any(-1, keepdim=True)
        return Categorical(self.actor(flat).masked_fill(~legal, ILLEGAL_LOGIT))
