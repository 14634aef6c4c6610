"""TQC (Kuznetsov et al. 2020, "Controlling Overestimation Bias with Truncated Mixture of
Continuous Distributional Quantile Critics", ICML): SAC whose critics predict quantiles of
the return, trained towards a target that pools every critic's quantiles and drops the
largest.

Everything else is SAC's (:mod:`rlloop.algorithms.sac`): the tanh-squashed Gaussian actor
(gSDE too), entropy tuning, Polyak targets, one backward pass over the critic, actor and
alpha losses with every loss seeing the parameters from before the update. The losses are
:func:`rlloop.losses.quantile.tqc_target`, :func:`~rlloop.losses.quantile.tqc_critic_loss`
and :func:`~rlloop.losses.quantile.tqc_actor_loss`.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import Tensor

from rlloop.algorithms.sac import SAC, SACLearner, SACModule
from rlloop.config.offpolicy import SACConfig
from rlloop.config.quantile import TQCConfig as TQCConfig
from rlloop.data.transitions import Transitions
from rlloop.losses.quantile import tqc_actor_loss, tqc_critic_loss, tqc_target
from rlloop.losses.sac import sac_alpha_loss
from rlloop.modules.encoders import Encoder
from rlloop.modules.q_networks import TwinQ


class TQCModule(SACModule):
    """SAC's module with ``n_critics`` quantile critics (stacked as one :class:`TwinQ`)."""

    def build_critic(self, obs_dim: int, act_dim: int, config: SACConfig,
                     encoder: Encoder | None) -> TwinQ:
        tqc = cast(TQCConfig, config)
        return TwinQ(obs_dim, act_dim, tqc.hidden, members=tqc.n_critics, encoder=encoder,
                     out_dim=tqc.n_quantiles)


class TQCLearner(SACLearner):
    """SAC's learner with the truncated quantile target and the quantile losses."""

    config: TQCConfig

    def _loss(self, m: SACModule, batch: Transitions, next_noise: Tensor, noise: Tensor
              ) -> tuple[Tensor, dict[str, Tensor]]:
        cfg = self.config
        alpha = m.log_alpha.detach().exp()
        kept = cfg.n_critics * (cfg.n_quantiles - cfg.top_quantiles_to_drop_per_net)
        with torch.no_grad():
            next_action, next_log_prob = m.actor(batch.next_obs, noise=next_noise)
            target = tqc_target(batch.reward, batch.discount, batch.terminated,
                                m.critic_target(batch.next_obs, next_action), next_log_prob,
                                alpha, kept)
        loss, stats = tqc_critic_loss(m.critic(batch.obs, batch.action), target)
        action, log_prob = m.actor(batch.obs, noise=noise)
        actor_loss, actor_stats = tqc_actor_loss(
            m.critic(batch.obs, action, detach_params=True), log_prob, alpha)
        loss = loss + actor_loss
        stats.update(actor_stats)
        if cfg.autotune_alpha:
            alpha_loss, alpha_stats = sac_alpha_loss(m.log_alpha, log_prob, self.target_entropy)
            loss = loss + alpha_loss
            stats.update(alpha_stats)
        return loss, stats


class TQC(SAC):
    """SAC's acting and cadence with truncated quantile critics."""

    name = "tqc"
    config: TQCConfig
    module_cls = TQCModule
    learner_cls = TQCLearner
