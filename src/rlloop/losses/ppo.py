"""The PPO objective (Schulman et al., 2017, "Proximal Policy Optimization Algorithms")."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class PPOLossConfig:
    """Coefficients of the PPO objective.

    Attributes:
        clip_coef: epsilon of the clipped surrogate, ``ratio in [1-eps, 1+eps]`` (a number,
            or a 0-dim tensor: a compiled update's graph input).
        vf_coef: Weight of the value loss.
        ent_coef: Weight of the entropy bonus (subtracted from the loss; a number or a
            0-dim tensor).
        clip_vf: If set, clip the new value to ``old_value +- clip_vf`` (PPO2 style).
        normalize_advantages: Standardise advantages within the minibatch.
    """

    clip_coef: float | Tensor = 0.2
    vf_coef: float = 0.5
    ent_coef: float | Tensor = 0.0
    clip_vf: float | None = None
    normalize_advantages: bool = True


def standardize(advantages: Tensor) -> Tensor:
    """``(A - mean) / (std + 1e-8)``: advantages standardised over their batch."""
    return (advantages - advantages.mean()) / (advantages.std() + 1e-8)


def ppo_loss(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    entropy: Tensor,
    cfg: PPOLossConfig,
    mask: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped-surrogate PPO loss over a minibatch of ``B`` samples (all tensors ``[B]``).

    ``mask`` ``[B]`` bool (recurrent PPO's padded sequences) leaves out the samples where it
    is False: every mean, and the advantage standardisation, runs over the others only.

    Returns the scalar loss to minimise and detached statistics:
    ``losses/policy``, ``losses/value``, ``losses/entropy``, ``ppo/approx_kl``
    (the low-variance ``(r - 1) - log r`` estimator) and ``ppo/clip_fraction``.
    """
    def mean(x: Tensor) -> Tensor:
        if mask is None:
            return x.mean()
        return torch.where(mask, x, 0.0).sum() / mask.sum().clamp(min=1)

    if cfg.normalize_advantages and advantages.numel() > 1:
        if mask is None:
            advantages = standardize(advantages)
        else:
            centred = advantages - mean(advantages)
            n = mask.sum().clamp(min=2)
            std = (mean(centred.pow(2)) * n / (n - 1)).sqrt()  # unbiased, as Tensor.std
            advantages = centred / (std + 1e-8)
    log_ratio = log_prob - old_log_prob
    ratio = log_ratio.exp()
    surrogate = ratio * advantages
    eps = cfg.clip_coef  # a float, or a 0-dim tensor (torch's stubs name one or the other)
    clipped = ratio.clamp(1 - eps, 1 + eps) * advantages  # type: ignore[arg-type]
    policy_loss = -mean(torch.min(surrogate, clipped))

    value_err = (values - returns).pow(2)
    if cfg.clip_vf is not None:
        v_clipped = old_values + (values - old_values).clamp(-cfg.clip_vf, cfg.clip_vf)
        value_err = torch.max(value_err, (v_clipped - returns).pow(2))
    value_loss = 0.5 * mean(value_err)

    entropy_mean = mean(entropy)
    loss = policy_loss + cfg.vf_coef * value_loss - cfg.ent_coef * entropy_mean
    with torch.no_grad():
        stats = {
            "losses/policy": policy_loss.detach(),
            "losses/value": value_loss.detach(),
            "losses/entropy": entropy_mean.detach(),
            "ppo/approx_kl": mean((ratio - 1) - log_ratio),
            "ppo/clip_fraction": mean(((ratio - 1).abs() > cfg.clip_coef).float()),
        }
    return loss, stats
