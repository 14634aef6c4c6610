"""V-trace: off-policy corrected value targets and policy-gradient advantages (Espeholt et
al., 2018, "IMPALA: Scalable Distributed Deep-RL with Importance Weighted Actor-Learner
Architectures", section 4).

IMPALA and APPO learn from fragments that a runner sampled with weights a few updates old
(the behaviour policy mu); V-trace corrects for the lag with truncated importance weights
``rho_t = min(rho_bar, pi(a_t|x_t) / mu(a_t|x_t))`` and ``c_t = min(c_bar, pi / mu)``.
With ``pi == mu`` and both bars >= 1 every weight is 1, and the targets are the n-step
bootstrapped returns to the end of the fragment.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor


class VTrace(NamedTuple):
    """What :func:`vtrace` returns, each ``[T, N]``."""

    targets: Tensor
    """``v_s``: the value targets (the critic regresses ``V(x_s)`` onto them)."""
    advantages: Tensor
    """``rho_s (r_s + gamma v_{s+1} - V(x_s))``: the policy-gradient advantages."""


def vtrace(
    target_log_probs: Tensor,
    behaviour_log_probs: Tensor,
    rewards: Tensor,
    values: Tensor,
    next_values: Tensor,
    terminated: Tensor,
    truncated: Tensor,
    gamma: float,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
) -> VTrace:
    """V-trace targets and advantages of a fragment of ``T`` steps of ``N`` envs.

    All tensors are ``[T, N]``, step ``t`` of env ``n`` at ``[t, n]``. ``values[t]`` is
    ``V(x_t)`` and ``next_values[t]`` the value of the observation after step t: ``V(x_{t+1})``
    within an episode, the value of the final observation where it was truncated (time
    limits bootstrap), anything where it terminated (a terminal state is worth 0; the term
    is masked), and at ``t = T-1`` the value where the fragment stops. An episode end
    (terminated or truncated) cuts the trace: nothing flows back across it.

    The recursion (the paper's remark 1): ``v_s - V(x_s) = delta_s + gamma c_s (v_{s+1} -
    V(x_{s+1}))`` with ``delta_s = rho_s (r_s + gamma V(x_{s+1}) - V(x_s))``, and the
    policy-gradient advantage ``rho_s (r_s + gamma v_{s+1} - V(x_s))``, where ``v_{s+1}``
    is ``next_values[s]`` at an episode's or the fragment's end. Computed without gradient.
    """
    with torch.no_grad():
        ratio = (target_log_probs - behaviour_log_probs).exp()
        rho = ratio.clamp(max=rho_bar)
        c = ratio.clamp(max=c_bar)
        ends = terminated | truncated
        discount = gamma * (~terminated).to(values.dtype)  # what r_s + gamma V(x') keeps
        carry = gamma * (~ends).to(values.dtype)  # what flows back from step s+1
        deltas = rho * (rewards + discount * next_values - values)
        diffs = torch.zeros_like(values)  # v_s - V(x_s)
        following = torch.zeros_like(values[0])
        for s in reversed(range(values.shape[0])):
            following = deltas[s] + carry[s] * c[s] * following
            diffs[s] = following
        targets = values + diffs
        # v_{s+1}: the next step's target within an episode and fragment, else next_values
        next_targets = torch.cat([targets[1:], next_values[-1:]])
        next_targets = torch.where(ends, next_values, next_targets)
        advantages = rho * (rewards + discount * next_targets - values)
    return VTrace(targets, advantages)
