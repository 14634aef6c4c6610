"""TD3 losses (Fujimoto et al. 2018, "Addressing Function Approximation Error in
Actor-Critic Methods", arXiv:1802.09477, Algorithm 1)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


@torch.no_grad()
def smoothed_target_action(
    target_actor_action: Tensor,
    noise_std: float,
    noise_clip: float,
    low: float | Tensor,
    high: float | Tensor,
    generator: torch.Generator | None = None,
    noise: Tensor | None = None,
) -> Tensor:
    """Target policy smoothing ``a' = clip(mu_targ(s') + clip(eps, -c, c), low, high)``
    with ``eps ~ N(0, noise_std^2)``.

    Args:
        target_actor_action: ``[B, act_dim]``, ``mu_targ(s')``.
        noise_std, noise_clip: In action units (the paper's 0.2 and 0.5 assume
            actions in ``[-1, 1]``).
        low, high: Action bounds, floats or ``[act_dim]`` tensors.
        generator: Source of the noise.
        noise: The standard normal draw ``[B, act_dim]`` (``eps / noise_std``), when
            the caller drew it (a compiled update does); else drawn from ``generator``.

    Returns:
        ``[B, act_dim]`` smoothed actions, without gradient.
    """
    action = target_actor_action
    if noise is None:
        gen_device = generator.device if generator is not None else action.device
        noise = torch.randn(action.shape, generator=generator, device=gen_device,
                            dtype=action.dtype)
    noise = (noise.to(action.device) * noise_std).clamp(-noise_clip, noise_clip)
    low_t = torch.as_tensor(low, dtype=action.dtype, device=action.device)
    high_t = torch.as_tensor(high, dtype=action.dtype, device=action.device)
    return (action + noise).clamp(low_t, high_t)


@torch.no_grad()
def td3_target(
    reward: Tensor,
    discount: Tensor,
    terminated: Tensor,
    next_q1_target: Tensor,
    next_q2_target: Tensor,
) -> Tensor:
    """Clipped double-Q target ``y = r + discount * (1 - terminated) * min(Q1', Q2')``.

    Args:
        reward, discount: ``[B]``; terminated: ``[B]`` bool.
        next_q1_target, next_q2_target: ``[B]``, target critics at ``(s', a')`` with
            ``a'`` from ``smoothed_target_action``.

    Returns:
        ``[B]`` targets, without gradient.
    """
    next_v = torch.minimum(next_q1_target, next_q2_target)
    return reward + discount * next_v.masked_fill(terminated, 0.0)


def td3_critic_loss(q1: Tensor, q2: Tensor, target: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    """``E[(Q1 - y)^2] + E[(Q2 - y)^2]`` for ``[B]`` inputs, as in the authors' code.

    Returns:
        Scalar loss; stats ``"losses/critic"``, ``"q/mean"``, ``"q/target_mean"``.
    """
    target = target.detach()
    loss = F.mse_loss(q1, target) + F.mse_loss(q2, target)
    stats = {
        "losses/critic": loss.detach(),
        "q/mean": 0.5 * (q1.detach().mean() + q2.detach().mean()),
        "q/target_mean": target.mean(),
    }
    return loss, stats


def td3_actor_loss(q1_pi: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    """Deterministic policy gradient objective ``-E[Q1(s, mu(s))]``, ``q1_pi`` ``[B]``.

    Returns:
        Scalar loss; stats ``"losses/actor"``.
    """
    loss = -q1_pi.mean()
    return loss, {"losses/actor": loss.detach()}
