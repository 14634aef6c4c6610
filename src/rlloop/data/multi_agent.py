"""Multi-agent rollout storage and advantages over the steps at which an agent acted.

In turn-based games an agent acts only every other env step, yet rewards may reach it at
any step (the loser of tic-tac-toe is told when the winner moves). :func:`masked_gae`
therefore runs GAE over each agent's own decision points: the rewards received between two
of its actions belong to the first one. With every step active it is plain GAE.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

#: AgentRollout's per-step fields, in order.
FIELDS = ("obs", "final_obs", "actions", "log_probs", "rewards", "terminated", "truncated",
          "active", "module")


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

    @classmethod
    def of(cls, **fields: Tensor) -> AgentRollout:
        """A rollout holding the given tensors (every field of :data:`FIELDS`)."""
        rollout = cls.__new__(cls)
        for name in FIELDS:
            setattr(rollout, name, fields[name])
        return rollout


@dataclass
class WaitingDecisions:
    """Per env, an agent's last decision of a rollout whose outcome lies in the next one:
    the agent waits for its turn while the episode goes on (turn-based games). It is
    trained with the next rollout, where the rewards that reach the agent before its next
    move (the loser told when the winner moves) and that move's value complete it.

    Attributes: ``waiting`` ``[N]`` bool, and the decision's ``obs``, ``actions``,
    ``log_probs``, ``module``, and ``rewards`` (those received after it so far), ``[N, ...]``.
    """

    waiting: Tensor
    obs: Tensor
    actions: Tensor
    log_probs: Tensor
    module: Tensor
    rewards: Tensor

    @classmethod
    def none(cls, rollout: AgentRollout) -> WaitingDecisions:
        """No decision waits (the start, or episodes that restarted)."""
        return cls(torch.zeros_like(rollout.active[0]), torch.zeros_like(rollout.obs[0]),
                   torch.zeros_like(rollout.actions[0]), torch.zeros_like(rollout.log_probs[0]),
                   torch.zeros_like(rollout.module[0]), torch.zeros_like(rollout.rewards[0]))


def with_waiting(rollout: AgentRollout, carried: WaitingDecisions) -> AgentRollout:
    """``rollout`` with one more step first (``T + 1`` rows): the decisions carried over,
    active where one waits, with the rewards it received so far."""
    first = {"obs": carried.obs, "final_obs": torch.zeros_like(carried.obs),
             "actions": carried.actions, "log_probs": carried.log_probs,
             "rewards": carried.rewards, "terminated": torch.zeros_like(carried.waiting),
             "truncated": torch.zeros_like(carried.waiting), "active": carried.waiting,
             "module": carried.module}
    return AgentRollout.of(**{name: torch.cat([first[name][None], getattr(rollout, name)])
                              for name in FIELDS})


def waiting_rows(rollout: AgentRollout, acts_next: Tensor) -> Tensor:
    """``[T, N]`` bool: per env, the agent's last decision when its episode goes on past the
    rollout while the agent does not act next (``acts_next`` ``[N]``, false): its return
    needs rewards and a decision of the next rollout."""
    active, ended = rollout.active, rollout.terminated | rollout.truncated
    steps = torch.arange(active.shape[0], device=active.device)[:, None].expand_as(active)
    last = torch.where(active, steps, -1).amax(0)  # [N], -1: no decision
    ended_since = (ended & (steps >= last)).any(0)
    waits = (last >= 0) & ~ended_since & ~acts_next
    return (steps == last) & waits


def waiting_decisions(rollout: AgentRollout, rows: Tensor) -> WaitingDecisions:
    """The decisions at ``rows`` (see :func:`waiting_rows`), carried into the next rollout
    with the rewards received after them."""
    waiting = rows.any(0)
    index = rows.int().argmax(0)  # the row of each env's waiting decision (0 where none)
    envs = torch.arange(rows.shape[1], device=rows.device)
    steps = torch.arange(rows.shape[0], device=rows.device)[:, None]
    since = (steps >= index) & waiting  # rewards after the decision (its own step's too)
    return WaitingDecisions(waiting, rollout.obs[index, envs], rollout.actions[index, envs],
                            rollout.log_probs[index, envs], rollout.module[index, envs],
                            (rollout.rewards * since).sum(0))


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
    waiting: Tensor | None = None,
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
        waiting: ``[T, N]`` bool, decisions whose outcome lies beyond the rollout
            (:func:`waiting_rows`): the earlier ones bootstrap from their value, as from
            the last step's; their own advantage is left at zero.

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
        if waiting is not None:
            gae_t = torch.where(waiting[t], zero, gae_t)
        advantages[t] = torch.where(act, gae_t, zero)
        running = torch.where(act, gae_t, running)
        next_value = torch.where(act, values[t], next_value)
        pending = torch.where(act, zero, pending)
    return advantages, torch.where(active, advantages + values, advantages)
