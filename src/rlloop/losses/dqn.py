"""DQN loss (Mnih et al. 2015, Nature 518) and the double-DQN target (van Hasselt et
al. 2016, arXiv:1509.06461)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


@torch.no_grad()
def dqn_target(
    reward: Tensor,
    discount: Tensor,
    terminated: Tensor,
    next_q_target: Tensor,
    next_q_online: Tensor | None = None,
) -> Tensor:
    """TD target ``y = r + discount * (1 - terminated) * Q_target(s', a*)``.

    Args:
        reward: ``[B]`` (n-step discounted sum when n > 1).
        discount: ``[B]``, ``gamma**k``.
        terminated: ``[B]`` bool.
        next_q_target: ``[B, A]``, target network at ``s'``.
        next_q_online: ``[B, A]``, online network at ``s'``. When given, ``a*`` is its
            argmax (double DQN); otherwise ``a*`` is the target network's argmax.

    Returns:
        ``[B]`` targets, without gradient.
    """
    if next_q_online is None:
        next_v = next_q_target.max(dim=1).values
    else:
        best = next_q_online.argmax(dim=1, keepdim=True)
        next_v = next_q_target.gather(1, best).squeeze(1)
    return reward + discount * next_v.masked_fill(terminated, 0.0)


def dqn_loss(
    q_values: Tensor, actions: Tensor, target: Tensor, weights: Tensor | None = None
) -> tuple[Tensor, dict[str, Tensor], Tensor]:
    """Huber (smooth L1, delta 1) loss between ``Q(s, a)`` and the TD target.

    Args:
        q_values: ``[B, A]``, online network at ``s``.
        actions: ``[B]`` int64 actions taken.
        target: ``[B]`` from ``dqn_target``.
        weights: ``[B]`` importance-sampling weights from prioritized replay, or ``None``.

    Returns:
        ``(loss, stats, td_errors)``: scalar loss; detached scalar stats
        ``"losses/q"``, ``"q/mean"``, ``"q/td_abs_mean"``; ``[B]`` detached
        ``target - Q(s, a)`` for ``update_priorities``.
    """
    q = q_values.gather(1, actions.long().unsqueeze(1)).squeeze(1)
    if weights is None:  # SB3's form: the mean inside the loss op (one autograd node)
        loss = F.smooth_l1_loss(q, target.detach())
    else:
        loss = (weights * F.smooth_l1_loss(q, target.detach(), reduction="none")).mean()
    td_errors = (target - q).detach()
    return loss, dqn_stats(loss.detach(), q.detach(), td_errors), td_errors


def dqn_stats(loss: Tensor, q: Tensor, td_errors: Tensor) -> dict[str, Tensor]:
    """The scalar stats of a DQN update: loss, mean ``Q(s, a)`` and mean ``|TD error|``."""
    return {"losses/q": loss, "q/mean": q.mean(), "q/td_abs_mean": td_errors.abs().mean()}
