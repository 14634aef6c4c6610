"""Soft actor-critic losses with a learned temperature (Haarnoja et al. 2018, "Soft
Actor-Critic Algorithms and Applications", arXiv:1812.05905, eqs. 5, 7 and 18)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


@torch.no_grad()
def sac_target(
    reward: Tensor,
    discount: Tensor,
    terminated: Tensor,
    next_q1_target: Tensor,
    next_q2_target: Tensor,
    next_log_prob: Tensor,
    alpha: float | Tensor,
) -> Tensor:
    """Soft TD target with clipped double-Q, ``a' ~ pi(.|s')``::

        y = r + discount * (1 - terminated) * (min(Q1_targ, Q2_targ)(s', a') - alpha log pi(a'|s'))

    Args:
        reward, discount: ``[B]``; terminated: ``[B]`` bool.
        next_q1_target, next_q2_target: ``[B]``, target critics at ``(s', a')``.
        next_log_prob: ``[B]``, ``log pi(a'|s')``.
        alpha: Entropy temperature (float or 0-dim tensor).

    Returns:
        ``[B]`` targets, without gradient.
    """
    next_v = torch.minimum(next_q1_target, next_q2_target) - alpha * next_log_prob
    return reward + discount * next_v.masked_fill(terminated, 0.0)


def sac_critic_loss(q1: Tensor, q2: Tensor, target: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    """``J_Q = 1/2 E[(Q1 - y)^2] + 1/2 E[(Q2 - y)^2]`` for ``Q1, Q2, y`` all ``[B]``.

    Returns:
        Scalar loss; stats ``"losses/critic"``, ``"q/mean"``, ``"q/target_mean"``.
    """
    target = target.detach()
    loss = 0.5 * (F.mse_loss(q1, target) + F.mse_loss(q2, target))
    stats = {
        "losses/critic": loss.detach(),
        "q/mean": 0.5 * (q1.detach().mean() + q2.detach().mean()),
        "q/target_mean": target.mean(),
    }
    return loss, stats


def sac_actor_loss(
    q1_pi: Tensor, q2_pi: Tensor, log_prob: Tensor, alpha: float | Tensor
) -> tuple[Tensor, dict[str, Tensor]]:
    """``J_pi = E[alpha log pi(a|s) - min(Q1, Q2)(s, a)]`` with ``a ~ pi(.|s)``
    reparameterised.

    Args:
        q1_pi, q2_pi: ``[B]``, critics at ``(s, a)``.
        log_prob: ``[B]``, ``log pi(a|s)``.
        alpha: Temperature; treated as a constant here.

    Returns:
        Scalar loss; stats ``"losses/actor"``, ``"policy/entropy"`` (``-E[log pi]``).
    """
    if isinstance(alpha, Tensor):
        alpha = alpha.detach()
    loss = (alpha * log_prob - torch.minimum(q1_pi, q2_pi)).mean()
    stats = {"losses/actor": loss.detach(), "policy/entropy": -log_prob.detach().mean()}
    return loss, stats


def sac_alpha_loss(
    log_alpha: Tensor, log_prob: Tensor, target_entropy: float
) -> tuple[Tensor, dict[str, Tensor]]:
    """``J(alpha) = E[-alpha (log pi(a|s) + H_target)]``, optimised through ``log_alpha``
    (as the authors' code and SB3 do) so that ``alpha`` stays positive.

    Args:
        log_alpha: 0-dim learnable tensor.
        log_prob: ``[B]``, ``log pi(a|s)``; treated as a constant here.
        target_entropy: Usually ``-action_dim``.

    Returns:
        Scalar loss; stats ``"losses/alpha"``, ``"alpha/value"``.
    """
    loss = -(log_alpha * (log_prob.detach() + target_entropy)).mean()
    stats = {"losses/alpha": loss.detach(), "alpha/value": log_alpha.detach().exp()}
    return loss, stats
