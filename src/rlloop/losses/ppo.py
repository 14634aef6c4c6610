"""The PPO objective (Schulman et al., 2017, "Proximal Policy Optimization Algorithms")."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class PPOLossConfig:
    """Coefficients of the PPO objective.

    Attributes:
        clip_coef: epsilon of the clipped surrogate, ``ratio in [1-eps, 1+eps]``.
        vf_coef: Weight of the value loss.
        ent_coef: Weight of the entropy bonus (subtracted from the loss).
        clip_vf: If set, clip the new value to ``old_value +- clip_vf`` (PPO2 style).
        normalize_advantages: Standardise advantages within the minibatch.
    """

    clip_coef: float = 0.2
    vf_coef: float = 0.5
    ent_coef: float = 0.0
    clip_vf: float | None = None
    normalize_advantages: bool = True


def ppo_loss(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    entropy: Tensor,
    cfg: PPOLossConfig,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped-surrogate PPO loss over a minibatch of ``B`` samples (all tensors ``[B]``).

    Returns the scalar loss to minimise and detached statistics:
    ``losses/policy``, ``losses/value``, ``losses/entropy``, ``ppo/approx_kl``
    (the low-variance ``(r - 1) - log r`` estimator) and ``ppo/clip_fraction``.
    """
    if cfg.normalize_advantages and advantages.numel() > 1:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    log_ratio = log_prob - old_log_prob
    ratio = log_ratio.exp()
    surrogate = ratio * advantages
    clipped = ratio.clamp(1 - cfg.clip_coef, 1 + cfg.clip_coef) * advantages
    policy_loss = -torch.min(surrogate, clipped).mean()

    value_err = (values - returns).pow(2)
    if cfg.clip_vf is not None:
        v_clipped = old_values + (values - old_values).clamp(-cfg.clip_vf, cfg.clip_vf)
        value_err = torch.max(value_err, (v_clipped - returns).pow(2))
    value_loss = 0.5 * value_err.mean()

    entropy_mean = entropy.mean()
    loss = policy_loss + cfg.vf_coef * value_loss - cfg.ent_coef * entropy_mean
    with torch.no_grad():
        stats = {
            "losses/policy": policy_loss.detach(),
            "losses/value": value_loss.detach(),
            "losses/entropy": entropy_mean.detach(),
            "ppo/approx_kl": ((ratio - 1) - log_ratio).mean(),
            "ppo/clip_fraction": ((ratio - 1).abs() > cfg.clip_coef).float().mean(),
        }
    return loss, stats
