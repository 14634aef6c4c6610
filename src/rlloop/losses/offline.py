"""Offline RL losses: behaviour cloning, CQL's conservative penalty (Kumar et al. 2020,
"Conservative Q-Learning for Offline Reinforcement Learning", arXiv:2006.04779, eq. 4 with
the importance-sampled log-sum-exp of the authors' code), and IQL's expectile value,
TD and advantage-weighted policy losses (Kostrikov et al. 2021, "Offline Reinforcement
Learning with Implicit Q-Learning", arXiv:2110.06169, eqs. 5-7).

Critic tensors are ``[C, B]`` (``C`` critics, ``B`` transitions); each critic's loss is
a mean over the batch and the critics' losses are summed, as the papers' code trains
each critic on its own loss.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor


def bc_discrete_loss(logits: Tensor, action: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    """``-E[log pi(a|s)]`` of the dataset's actions: cross-entropy of ``logits [B, n]``
    against ``action [B]`` (int64).

    Returns:
        Scalar loss; stats ``"losses/bc"``, ``"policy/accuracy"`` (greedy action is the
        dataset's).
    """
    loss = F.cross_entropy(logits, action)
    accuracy = (logits.detach().argmax(-1) == action).float().mean()
    return loss, {"losses/bc": loss.detach(), "policy/accuracy": accuracy}


def bc_continuous_loss(pred: Tensor, action: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    """``E[|mu(s) - a|^2]`` (summed over action dimensions) of the policy's action
    ``pred [B, d]`` against the dataset's ``action [B, d]``, both in ``[-1, 1]``.

    Returns:
        Scalar loss; stats ``"losses/bc"``.
    """
    loss = (pred - action).square().flatten(1).sum(-1).mean()
    return loss, {"losses/bc": loss.detach()}


def td_loss(q: Tensor, target: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    """``sum_i E[(Q_i(s, a) - y)^2]`` for ``q [C, B]`` and a target ``y [B]`` (detached).

    Returns:
        Scalar loss; stats ``"losses/critic"``, ``"q/mean"``, ``"q/target_mean"``.
    """
    target = target.detach()
    loss = (q - target).square().mean(-1).sum()
    return loss, {"losses/critic": loss.detach(), "q/mean": q.detach().mean(),
                  "q/target_mean": target.mean()}


def cql_penalty(q_data: Tensor, q_random: Tensor, q_pi: Tensor, log_pi: Tensor,
                q_next_pi: Tensor, next_log_pi: Tensor, act_dim: int, weight: float,
                temperature: float = 1.0) -> tuple[Tensor, dict[str, Tensor]]:
    """CQL(H)'s penalty, summed over critics and averaged over the batch::

        weight * (T * log sum_j exp(Q(s, a_j) / T - log mu(a_j)) - Q(s, a_data))

    where the ``3N`` actions ``a_j`` per state are ``N`` uniform ones on ``[-1, 1]^d``
    (density ``0.5^d``), ``N`` from the policy at ``s`` and ``N`` from the policy at the
    next state, each divided by its density (importance sampling of the log-sum-exp
    over actions, as the authors' code does; the densities are constants here).

    Args:
        q_data: ``[C, B]``, the critics at the dataset's actions.
        q_random, q_pi, q_next_pi: ``[C, B, N]``, the critics at the sampled actions.
        log_pi, next_log_pi: ``[B, N]``, the policy's log-densities of its actions.
        act_dim: ``d``. weight, temperature: the penalty's weight and ``T``.

    Returns:
        Scalar penalty; stats ``"losses/cql"``, ``"q/ood_logsumexp"``.
    """
    random_log_density = act_dim * math.log(0.5)
    scores = torch.cat([q_random - random_log_density, q_pi - log_pi.detach(),
                        q_next_pi - next_log_pi.detach()], -1)
    logsumexp = temperature * torch.logsumexp(scores / temperature, -1)  # [C, B]
    penalty = weight * (logsumexp - q_data).mean(-1).sum()
    return penalty, {"losses/cql": penalty.detach(),
                     "q/ood_logsumexp": logsumexp.detach().mean()}


def expectile_loss(diff: Tensor, expectile: float) -> Tensor:
    """``E[|tau - 1(u < 0)| u^2]`` of ``diff = u`` (the asymmetric squared loss whose
    minimiser is the ``tau``-expectile)."""
    weight = torch.where(diff > 0, expectile, 1.0 - expectile)
    return (weight * diff.square()).mean()


def iql_value_loss(q_target: Tensor, value: Tensor, expectile: float
                   ) -> tuple[Tensor, dict[str, Tensor]]:
    """``L_V = E[L2^tau(min_i Q_target,i(s, a) - V(s))]`` (eq. 5) for ``q_target [C, B]``
    and ``value [B]``.

    Returns:
        Scalar loss; stats ``"losses/value"``, ``"v/mean"``.
    """
    loss = expectile_loss(q_target.detach().min(0).values - value, expectile)
    return loss, {"losses/value": loss.detach(), "v/mean": value.detach().mean()}


def iql_critic_loss(q: Tensor, reward: Tensor, discount: Tensor, terminated: Tensor,
                    next_value: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    """``L_Q = sum_i E[(r + gamma (1 - terminated) V(s') - Q_i(s, a))^2]`` (eq. 6) for
    ``q [C, B]`` and ``reward, discount, next_value [B]`` (``terminated`` bool)."""
    target = reward + discount * next_value.detach().masked_fill(terminated, 0.0)
    return td_loss(q, target)


def iql_actor_loss(log_prob: Tensor, q_target: Tensor, value: Tensor, temperature: float,
                   max_weight: float) -> tuple[Tensor, dict[str, Tensor]]:
    """``L_pi = -E[min(exp(beta (min_i Q_target,i(s, a) - V(s))), w_max) log pi(a|s)]``
    (eq. 7, the weights clipped as the authors' code does) for the dataset's ``(s, a)``:
    ``log_prob, value [B]``, ``q_target [C, B]``.

    Returns:
        Scalar loss; stats ``"losses/actor"``, ``"policy/weight_mean"``.
    """
    advantage = q_target.detach().min(0).values - value.detach()
    weight = torch.exp(temperature * advantage).clamp(max=max_weight)
    loss = -(weight * log_prob).mean()
    return loss, {"losses/actor": loss.detach(), "policy/weight_mean": weight.mean()}


def cql_discrete_loss(q_values: Tensor, action: Tensor, target: Tensor, weight: float
                      ) -> tuple[Tensor, dict[str, Tensor]]:
    """Discrete CQL(H): ``1/2 E[(Q(s, a) - y)^2] + w E[log sum_b exp Q(s, b) - Q(s, a)]`` for
    ``q_values [B, n]``, the dataset's ``action [B]`` (int64) and a TD target ``y [B]``
    (``dqn_target``'s, detached); the log-sum-exp over every action is exact here.

    Returns:
        Scalar loss; stats ``"losses/critic"`` (the TD part), ``"losses/cql"`` (the
        penalty, weighted), ``"q/mean"``.
    """
    q = q_values.gather(-1, action.unsqueeze(-1)).squeeze(-1)
    td = 0.5 * (q - target.detach()).square().mean()
    penalty = weight * (torch.logsumexp(q_values, -1) - q).mean()
    return td + penalty, {"losses/critic": td.detach(), "losses/cql": penalty.detach(),
                          "q/mean": q.detach().mean()}
