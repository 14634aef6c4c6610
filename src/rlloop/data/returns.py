"""Returns and advantages as pure functions over ``[T, N]`` tensors.

``terminated`` and ``truncated`` are separate everywhere: a terminal state has
value zero, while a time-limit truncation bootstraps from the value of the final
observation (Pardo et al., 2018, "Time Limits in Reinforcement Learning").
"""

from __future__ import annotations

import torch
from torch import Tensor


def gae(
    rewards: Tensor,
    values: Tensor,
    next_values: Tensor,
    terminated: Tensor,
    truncated: Tensor,
    gamma: float,
    lam: float,
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation (Schulman et al., 2016).

    Args:
        rewards: ``[T, N]`` reward received after the action at step ``t``.
        values: ``[T, N]`` ``V(s_t)``.
        next_values: ``[T, N]`` ``V(s_{t+1})`` of the *same* episode: the value of the
            final observation where the episode ended at ``t``, of ``s_{t+1}`` otherwise.
        terminated: ``[T, N]`` bool, ``s_{t+1}`` is terminal (its value is zero).
        truncated: ``[T, N]`` bool, the episode was cut after ``t`` (bootstrap from
            ``next_values`` but do not carry the advantage across the cut).
        gamma: Discount factor.
        lam: GAE's lambda; 1 gives Monte-Carlo advantages, 0 gives TD(0).

    Returns:
        ``(advantages, returns)``, both ``[T, N]``, with ``returns = advantages + values``.
    """
    not_terminal = (~terminated).to(values.dtype)
    episode_continues = (~(terminated | truncated)).to(values.dtype)
    deltas = rewards + gamma * not_terminal * next_values - values
    carried = gamma * lam * episode_continues  # the share of A_{t+1} that A_t keeps
    running = torch.zeros_like(values[0])
    # Rows as views made once, stacked once at the end: with few envs and steps (A2C's
    # 5 x 8) indexing or copying each step costs as much as its math.
    backwards = []
    for delta, carry in zip(deltas.unbind(0)[::-1], carried.unbind(0)[::-1], strict=True):
        running = delta + carry * running
        backwards.append(running)
    advantages = torch.stack(backwards[::-1])
    return advantages, advantages + values


def discounted_returns(rewards: Tensor, terminated: Tensor, truncated: Tensor, gamma: float,
                       bootstrap: Tensor | None = None) -> Tensor:
    """Discounted reward-to-go ``G_t = r_t + gamma * G_{t+1}``, restarting at episode ends.

    Args:
        rewards: ``[T, ...]``.
        terminated: ``[T, ...]`` bool; the return after a terminal step is zero.
        truncated: ``[T, ...]`` bool; the return after a cut is ``bootstrap[t]`` if
            given (e.g. ``V(final_obs)``), else zero.
        gamma: Discount factor.
        bootstrap: ``[T, ...]`` value used after truncations and after the last step.

    Returns:
        ``[T, ...]`` returns.
    """
    out = torch.empty_like(rewards)
    zero = torch.zeros_like(rewards[0])
    running = bootstrap[-1] if bootstrap is not None else zero
    for t in range(rewards.shape[0] - 1, -1, -1):
        after_cut = bootstrap[t] if bootstrap is not None else zero
        running = torch.where(truncated[t], after_cut, running)
        running = torch.where(terminated[t], zero, running)
        running = rewards[t] + gamma * running
        out[t] = running
    return out
