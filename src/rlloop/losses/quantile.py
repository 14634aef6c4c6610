"""Quantile regression losses: the quantile Huber loss (Dabney et al. 2018, "Distributional
Reinforcement Learning with Quantile Regression", AAAI, eq. 10) that QR-DQN and TQC (Kuznetsov
et al. 2020, "Controlling Overestimation Bias with Truncated Mixture of Continuous
Distributional Quantile Critics", ICML) both minimise, and each one's targets."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from rlloop.losses.dqn import dqn_stats


def quantile_midpoints(n: int, like: Tensor) -> Tensor:
    """``[n]`` quantile fractions ``(i + 0.5) / n`` in ``like``'s dtype and device: the
    midpoints whose quantiles minimise the 1-Wasserstein distance (the paper's Lemma 2)."""
    return (torch.arange(n, dtype=like.dtype, device=like.device) + 0.5) / n


def quantile_huber_loss(current: Tensor, target: Tensor, weights: Tensor | None = None,
                        sum_over_quantiles: bool = True) -> Tensor:
    """Quantile Huber loss (kappa = 1) of ``current`` quantiles against ``target`` samples.

    Every current quantile ``i`` is regressed on every target sample ``j``: the Huber loss
    of ``delta = target_j - current_i`` weighted by ``|tau_i - 1{delta < 0}|``. Summed over
    the current quantiles (as the QR-DQN paper writes it), averaged over the target
    samples, the critics and the batch; or averaged over everything with
    ``sum_over_quantiles=False`` (TQC's critic loss, as its authors' code and sb3-contrib).

    Args:
        current: ``[B, N]`` (QR-DQN) or ``[B, C, N]`` (TQC: ``C`` critics) quantiles at the
            midpoints of :func:`quantile_midpoints`.
        target: ``[B, M]`` or ``[B, 1, M]`` target samples, without gradient.
        weights: ``[B]`` importance-sampling weights (prioritized replay), or ``None``.
        sum_over_quantiles: Sum (True) or average (False) over the current quantiles.

    Returns:
        The scalar loss.
    """
    if current.ndim != target.ndim or current.shape[0] != target.shape[0]:
        raise ValueError(f"current {tuple(current.shape)} and target {tuple(target.shape)} "
                         "must both be [B, N] or [B, C, N] over the same batch")
    tau = quantile_midpoints(current.shape[-1], current).unsqueeze(-1)  # [N, 1]
    shape = (*current.shape, target.shape[-1])  # [B, (C,) N, M]: every (i, j) pair
    cur, tgt = current.unsqueeze(-1).expand(shape), target.detach().unsqueeze(-2).expand(shape)
    # One fused Huber op and a weight without gradient: about a fifth faster (forward and
    # backward) than the written-out where(|delta| > 1, ...) on one CPU thread.
    huber = F.huber_loss(cur, tgt, reduction="none")
    loss = torch.where(tgt < cur.detach(), 1 - tau, tau) * huber
    loss = loss.sum(-2) if sum_over_quantiles else loss
    if weights is None:
        return loss.mean()
    per_sample = loss.flatten(1).mean(1)  # [B]
    return (weights * per_sample).mean()


@torch.no_grad()
def qrdqn_target(reward: Tensor, discount: Tensor, terminated: Tensor,
                 next_quantiles: Tensor, next_q: Tensor) -> Tensor:
    """Target quantiles ``r + discount * (1 - terminated) * Z_target(s', a*)``.

    Args:
        reward: ``[B]`` (n-step discounted sum when n > 1).
        discount: ``[B]``, ``gamma**k``.
        terminated: ``[B]`` bool.
        next_quantiles: ``[B, N, A]``, the target network's quantiles at ``s'``.
        next_q: ``[B, A]`` Q-values whose argmax is ``a*``: the target network's mean
            quantiles (QR-DQN), or the online network's (double Q-learning); illegal
            actions already masked.

    Returns:
        ``[B, N]`` target quantiles, without gradient.
    """
    best = next_q.argmax(1).view(-1, 1, 1).expand(-1, next_quantiles.shape[1], 1)
    next_z = next_quantiles.gather(2, best).squeeze(2)
    return reward.unsqueeze(1) + discount.unsqueeze(1) * next_z.masked_fill(
        terminated.unsqueeze(1), 0.0)


def qrdqn_loss(quantiles: Tensor, actions: Tensor, target: Tensor,
               weights: Tensor | None = None) -> tuple[Tensor, dict[str, Tensor], Tensor]:
    """QR-DQN's loss: the quantile Huber loss of the taken actions' quantiles.

    Args:
        quantiles: ``[B, N, A]``, the online network at ``s``.
        actions: ``[B]`` int64 actions taken.
        target: ``[B, N]`` from :func:`qrdqn_target`.
        weights: ``[B]`` importance-sampling weights, or ``None``.

    Returns:
        ``(loss, stats, td_errors)`` as :func:`rlloop.losses.dqn.dqn_loss` gives them, with
        ``td_errors`` the difference of the target's and the current quantiles' means
        (prioritized replay's priorities).
    """
    index = actions.long().view(-1, 1, 1).expand(-1, quantiles.shape[1], 1)
    current = quantiles.gather(2, index).squeeze(2)
    loss = quantile_huber_loss(current, target, weights)
    q = current.detach().mean(1)
    td_errors = target.mean(1) - q
    return loss, dqn_stats(loss.detach(), q, td_errors), td_errors


@torch.no_grad()
def tqc_target(reward: Tensor, discount: Tensor, terminated: Tensor, next_quantiles: Tensor,
               next_log_prob: Tensor, alpha: float | Tensor, kept: int) -> Tensor:
    """TQC's truncated soft target: the ``kept`` smallest of all critics' target quantiles
    at ``(s', a' ~ pi)``, minus ``alpha log pi(a'|s')``, discounted and added to the reward.

    Dropping the largest quantiles of the pooled mixture is how TQC controls the
    overestimation that SAC's min over two critics controls more coarsely.

    Args:
        reward, discount: ``[B]``; terminated: ``[B]`` bool.
        next_quantiles: ``[B, C, N]``, the target critics' quantiles at ``(s', a')``.
        next_log_prob: ``[B]``, ``log pi(a'|s')``.
        alpha: Entropy temperature.
        kept: Target quantiles kept, ``C * (N - top_quantiles_to_drop_per_net)``.

    Returns:
        ``[B, 1, kept]`` target quantiles (one set for every critic), without gradient.
    """
    pooled = next_quantiles.flatten(1).sort(1).values[:, :kept]
    next_z = pooled - alpha * next_log_prob.unsqueeze(1)
    target = reward.unsqueeze(1) + discount.unsqueeze(1) * next_z.masked_fill(
        terminated.unsqueeze(1), 0.0)
    return target.unsqueeze(1)


def tqc_critic_loss(current: Tensor, target: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    """Every critic's quantiles ``[B, C, N]`` against the shared ``[B, 1, M]`` target,
    averaged over the quantiles (``sum_over_quantiles=False``).

    Returns:
        Scalar loss; stats ``"losses/critic"``, ``"q/mean"``, ``"q/target_mean"``.
    """
    loss = quantile_huber_loss(current, target, sum_over_quantiles=False)
    return loss, {"losses/critic": loss.detach(), "q/mean": current.detach().mean(),
                  "q/target_mean": target.mean()}


def tqc_actor_loss(quantiles_pi: Tensor, log_prob: Tensor, alpha: float | Tensor
                   ) -> tuple[Tensor, dict[str, Tensor]]:
    """``E[alpha log pi(a|s) - Q(s, a)]`` with ``Q`` the mean of every critic's quantiles
    (no truncation and no min: the critics' targets carry the pessimism).

    Args:
        quantiles_pi: ``[B, C, N]`` at ``(s, a ~ pi)``, critics' weights held constant.
        log_prob: ``[B]``, ``log pi(a|s)``.
        alpha: Temperature, a constant here.

    Returns:
        Scalar loss; stats ``"losses/actor"``, ``"policy/entropy"``.
    """
    if isinstance(alpha, Tensor):
        alpha = alpha.detach()
    loss = (alpha * log_prob - quantiles_pi.mean((1, 2))).mean()
    return loss, {"losses/actor": loss.detach(), "policy/entropy": -log_prob.detach().mean()}
