"""Multi-agent rollout storage and advantages over the steps at which an agent acted.

In turn-based games an agent acts only every other env step, yet rewards may reach it at
any step (the loser of tic-tac-toe is told when the winner moves). :func:`masked_gae`
therefore runs GAE over each agent's own decision points: the rewards received between two
of its actions belong to the first one. With every step active it is plain GAE.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


class AgentRollout:
    """``T`` steps of ``N`` envs for one agent, written in place by the runner.

    Attributes (shapes):
        obs, final_obs: ``[T, N, *obs]`` observation acted on / last one of an ended episode.
        All storage is on ``device``.
        actions: ``[T, N, *act]``; log_probs, rewards: ``[T, N]``.
        terminated, truncated: ``[T, N]`` bool, the agent's episode ended after step ``t``.
        active: ``[T, N]`` bool, the agent's action at ``t`` counted (alive, its turn).
        module: ``[T, N]`` int64 index into the runner's module table: who acted.
    """

    def __init__(self, steps: int, num_envs: int, obs_shape: Sequence[int],
                 action_shape: Sequence[int], action_dtype: torch.dtype,
                 device: str | torch.device = "cpu") -> None:
        t, n, d = steps, num_envs, torch.device(device)
        self.obs = torch.zeros((t, n, *obs_shape), device=d)
        self.final_obs = torch.zeros((t, n, *obs_shape), device=d)
        self.actions = torch.zeros((t, n, *action_shape), dtype=action_dtype, device=d)
        self.log_probs = torch.zeros((t, n), device=d)
        self.rewards = torch.zeros((t, n), device=d)
        self.terminated = torch.zeros((t, n), dtype=torch.bool, device=d)
        self.truncated = torch.zeros((t, n), dtype=torch.bool, device=d)
        self.active = torch.zeros((t, n), dtype=torch.bool, device=d)
        self.module = torch.zeros((t, n), dtype=torch.int64, device=d)


def masked_gae(
    rewards: Tensor,
    values: Tensor,
    final_values: Tensor,
    last_values: Tensor,
    terminated: Tensor,
    truncated: Tensor,
    active: Tensor,
    gamma: float,
    lam: float,
) -> tuple[Tensor, Tensor]:
    """GAE (Schulman et al., 2016) over the steps where ``active`` is set.

    Args:
        rewards: ``[T, N]`` reward received after step ``t`` (acting or not).
        values: ``[T, N]`` ``V(s_t)`` (only read where active).
        final_values: ``[T, N]`` value of the final observation, read where ``truncated``.
        last_values: ``[N]`` value of the observation after the last step.
        terminated, truncated: ``[T, N]`` bool, the episode ended after step ``t``.
        active: ``[T, N]`` bool, the agent acted at step ``t``.
        gamma, lam: Discount and GAE lambda, applied per decision of the agent.

    Returns:
        ``(advantages, returns)``, ``[T, N]``, zero where not active.
    """
    advantages = torch.zeros_like(values)
    running = torch.zeros_like(last_values)  # GAE of the agent's next decision
    next_value = last_values.clone()  # value of the agent's next decision point
    pending = torch.zeros_like(last_values)  # rewards since the agent's next decision
    zero = torch.zeros_like(last_values)
    for t in range(rewards.shape[0] - 1, -1, -1):
        ended = terminated[t] | truncated[t]
        next_value = torch.where(terminated[t], zero,
                                 torch.where(truncated[t], final_values[t], next_value))
        running = torch.where(ended, zero, running)
        pending = torch.where(ended, zero, pending) + rewards[t]
        delta = pending + gamma * next_value - values[t]
        gae_t = delta + gamma * lam * running
        act = active[t]
        advantages[t] = torch.where(act, gae_t, zero)
        running = torch.where(act, gae_t, running)
        next_value = torch.where(act, values[t], next_value)
        pending = torch.where(act, zero, pending)
    return advantages, torch.where(active, advantages + values, advantages)
