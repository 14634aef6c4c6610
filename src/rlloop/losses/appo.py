"""APPO's objective: PPO's clipped surrogate on V-trace's advantages and targets, the ratio
taken against the behaviour policy (Espeholt et al., 2018, for V-trace; Schulman et al.,
2017, for the surrogate; RLlib names the pair APPO).

IMPALA's objective is :func:`rlloop.losses.a2c.a2c_loss` on V-trace's advantages and
targets (one step per batch: no ratio, no clip), so it needs no function of its own.
"""

from __future__ import annotations

from torch import Tensor

from rlloop.losses.ppo import PPOLossConfig, ppo_loss


def appo_loss(
    log_prob: Tensor,
    behaviour_log_prob: Tensor,
    advantages: Tensor,
    values: Tensor,
    old_values: Tensor,
    targets: Tensor,
    entropy: Tensor,
    cfg: PPOLossConfig,
) -> tuple[Tensor, dict[str, Tensor]]:
    """APPO's loss over a minibatch of ``B`` samples of V-trace'd fragments (all ``[B]``).

    With ``r = pi_theta(a|s) / mu(a|s)``, ``mu`` the weights that sampled the fragment
    (``behaviour_log_prob``), ``A`` and ``v`` V-trace's advantages and targets
    (:func:`rlloop.losses.vtrace.vtrace`, computed once per batch with the learner's
    weights at its start) and ``H`` the entropy:

    ``-mean(min(r A, clip(r, 1-eps, 1+eps) A)) + vf_coef * 1/2 mean((V - v)^2)
    - ent_coef * mean(H)``

    That is :func:`rlloop.losses.ppo.ppo_loss` with the behaviour policy's log-probabilities
    as the old ones and V-trace's targets as the returns: the same clipping, value clipping
    (``clip_vf`` against ``old_values``, V at the batch's start) and statistics. RLlib's
    APPO (IMPACT, Luo et al., 2020) takes its ratio against a target network instead
    (``clip(mu / pi_target, 0, 2) * pi_theta / mu``), adds an adaptive KL term, and does not
    standardise advantages (``cfg.normalize_advantages``); with its target network equal to
    the behaviour policy and no KL, it computes this loss, but for the bootstrap at a
    fragment's end, which its appended step partly cancels
    (``tests/losses/test_appo_loss_equals_rllib.py`` pins both).
    """
    return ppo_loss(log_prob, behaviour_log_prob, advantages, values, old_values, targets,
                    entropy, cfg)
