"""The off-policy family's one batch type: transitions ready for a TD target.

Step processors emit them, replay buffers store and sample them, and learners (local,
data-parallel and fed by Ray fragments) train on them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from torch import Tensor

from rlloop.data.batch import TensorBatch


@dataclass(frozen=True)
class Transitions(TensorBatch):
    """A batch of ``B`` transitions.

    The target of a transition is ``reward + discount * (1 - terminated) * V(next_obs)``,
    where ``k`` rewards were summed (``k = 1`` for one-step transitions).

    Attributes:
        obs: ``[B, *obs_shape]``, observation the first action was taken in.
        action: ``[B, *action_shape]``; int64 ``[B]`` for discrete actions.
        reward: ``[B]`` float32, ``r_t + γ r_{t+1} + ... + γ^{k-1} r_{t+k-1}``.
        next_obs: ``[B, *obs_shape]``, observation ``k`` steps later; the final
            observation of the episode when it ended within those steps.
        terminated: ``[B]`` bool, the episode reached a terminal state within the
            ``k`` steps, so the target does not bootstrap.
        discount: ``[B]`` float32, ``γ^k``.
        weights: ``[B]`` float32 importance-sampling weights (prioritized sampling
            only), else ``None``.
        indices: ``[B]`` int64 storage rows a replay buffer's ``sample`` read the batch
            from, for ``update_priorities``; ``None`` before storage and in what a
            learner gets (:meth:`for_update`).
    """

    obs: Tensor
    action: Tensor
    reward: Tensor
    next_obs: Tensor
    terminated: Tensor
    discount: Tensor
    weights: Tensor | None = None
    indices: Tensor | None = None

    def for_update(self) -> Transitions:
        """This batch without ``indices``, which no update reads: a compiled update then
        takes the same inputs from every replay buffer, and a sharded one sends no rows
        to the other learners."""
        if self.indices is None:
            return self
        return dataclasses.replace(self, indices=None)
