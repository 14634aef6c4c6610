"""The A2C objective (Mnih et al., 2016, "Asynchronous Methods for Deep Reinforcement
Learning"; its synchronous form as OpenAI Baselines and Stable-Baselines3 run it)."""

from __future__ import annotations

from torch import Tensor

from rlloop.losses.ppo import standardize


def a2c_loss(
    log_prob: Tensor,
    advantages: Tensor,
    values: Tensor,
    returns: Tensor,
    entropy: Tensor,
    vf_coef: float,
    ent_coef: float,
    normalize_advantages: bool = False,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The advantage actor-critic loss over a batch of ``B`` samples (all tensors ``[B]``):
    ``-mean(A log pi(a|s)) + vf_coef * 1/2 mean((V - R)^2) - ent_coef * mean(H)``.

    The policy term is the plain policy gradient: A2C takes one step per rollout, so the
    policy that acted is the one differentiated and needs no ratio or clipping. The value
    term carries 1/2, as PPO's does in rlloop (``vf_coef`` means the same in both: twice
    Stable-Baselines3's). ``normalize_advantages`` standardises ``advantages`` over the
    batch first. With ``ent_coef == 0`` the entropy is not differentiated (its term is
    zero, and so is its gradient).

    Returns the scalar loss to minimise and detached statistics: ``losses/policy``,
    ``losses/value`` and ``losses/entropy``.
    """
    if normalize_advantages and advantages.numel() > 1:
        advantages = standardize(advantages)
    policy_loss = -(advantages * log_prob).mean()
    value_loss = 0.5 * (values - returns).pow(2).mean()
    entropy_mean = entropy.mean()
    loss = policy_loss + vf_coef * value_loss
    # Without an entropy bonus (rl-zoo's CartPole and most of its A2C settings) the term
    # is left out: subtracting 0 * mean(H) leaves the loss as it is, and its backward pass
    # (seven nodes, ~25 µs of a CartPole update) would only add zeros to the gradients.
    if ent_coef != 0.0:
        loss = loss - ent_coef * entropy_mean
    stats = {
        "losses/policy": policy_loss.detach(),
        "losses/value": value_loss.detach(),
        "losses/entropy": entropy_mean.detach(),
    }
    return loss, stats
