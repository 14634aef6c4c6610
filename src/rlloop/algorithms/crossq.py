"""CrossQ (Bhatt et al. 2024, "CrossQ: Batch Normalization in Deep Reinforcement Learning
for Greater Sample Efficiency and Simplicity", ICLR): SAC without target networks, whose
critics and actor batch-renormalise every layer's input.

The critics evaluate ``(s, a)`` and ``(s', a')`` as one joint batch, so that the
normalisation statistics of the training pass cover both distributions, and the TD target
is read off the same pass (no target critics). The update runs as sb3-contrib's: the
critics step first; every ``policy_delay`` updates the actor and the temperature then step
on the updated critics (read with their running statistics). Everything else is SAC's
(:mod:`rlloop.algorithms.sac`): the acting, entropy tuning, the cadence and the losses of
:mod:`rlloop.losses.sac`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import cast

import torch
from torch import Tensor, nn

from rlloop.algorithms.sac import SAC, SACLearner, SACModule
from rlloop.config.crossq import CrossQConfig as CrossQConfig
from rlloop.config.offpolicy import SACConfig
from rlloop.data.transitions import Transitions
from rlloop.errors import ConfigError
from rlloop.losses.sac import sac_actor_loss, sac_critic_loss, sac_target
from rlloop.modules.batch_renorm import Norm, RenormTanhGaussianActor, RenormTwinQ
from rlloop.modules.encoders import Encoder
from rlloop.modules.q_networks import standard_normal


class CrossQModule(SACModule):
    """The batch-renormalised actor and twin critics, and ``log alpha``; no targets."""

    def __init__(self, obs_dim: int, act_dim: int, config: SACConfig,
                 encoder: Callable[[], Encoder | None] = lambda: None) -> None:
        nn.Module.__init__(self)  # SAC's module builds target critics; this one has none
        cfg = cast(CrossQConfig, config)
        if encoder() is not None:
            raise ConfigError("crossq takes vector observations (as sb3-contrib's CrossQ, "
                              "MlpPolicy only); set crossq.encoder=mlp to flatten these, "
                              "or use sac")
        norm = (cfg.batch_norm_momentum, cfg.batch_norm_eps)
        self.actor = RenormTanhGaussianActor(obs_dim, act_dim, cfg.hidden, *norm)  # type: ignore[assignment]
        self.critic = RenormTwinQ(obs_dim, act_dim, cfg.critic_hidden, *norm)  # type: ignore[assignment]
        self.log_alpha = nn.Parameter(torch.tensor(math.log(cfg.init_alpha)),
                                      requires_grad=cfg.autotune_alpha)


class CrossQLearner(SACLearner):
    """The joint-batch critic step, then every ``policy_delay`` updates the actor and alpha
    step: two backward passes, each through :attr:`step` (a non-finite one is skipped)."""

    config: CrossQConfig

    def configure_optimizers_for_module(self, module_id: str, config: SACConfig) -> None:
        """Adam with ``betas=(adam_beta1, 0.999)`` for the actor and the critics; the
        temperature's keeps Adam's default (0.9, 0.999), as sb3-contrib's."""
        m = self.module(module_id)
        betas = (self.config.adam_beta1, 0.999)
        for name, part in (("actor", m.actor), ("critic", m.critic)):
            self.add_adam(module_id, name, list(part.parameters()), config.lr, betas=betas)
        if config.autotune_alpha:
            self.add_adam(module_id, "alpha", [m.log_alpha], config.lr)

    def norms(self) -> tuple[Norm, Norm]:
        """The critics' and the actor's training-pass :data:`Norm` for the coming update:
        plain batch statistics for their first ``renorm_warmup_steps`` passes (the critics
        make one per update, the actor one per ``policy_delay``), renormalised after."""
        warmup = self.config.renorm_warmup_steps
        actor_passes = self.updates // self.config.policy_delay
        return ("renorm" if self.updates > warmup else "batch",
                "renorm" if actor_passes > warmup else "batch")

    def actor_update_due(self) -> bool:
        """Whether the coming update steps the actor and alpha (updates d, 2d, ...)."""
        return (self.updates + 1) % self.config.policy_delay == 0

    def critic_loss(self, batch: Transitions, next_noise: Tensor, norm: Norm
                    ) -> tuple[Tensor, dict[str, Tensor]]:
        """The critic loss of one joint pass over ``[(s, a); (s', a')]``, whose second half
        gives the TD target (without gradient)."""
        m = self.module()
        alpha = m.log_alpha.detach().exp()
        with torch.no_grad():
            next_action, next_log_prob = m.actor(batch.next_obs, noise=next_noise)
        q, next_q = m.critic(torch.cat([batch.obs, batch.next_obs]),
                             torch.cat([batch.action.to(next_action.dtype), next_action]),
                             norm).chunk(2, dim=1)
        target = sac_target(batch.reward, batch.discount, batch.terminated, next_q[0].detach(),
                            next_q[1].detach(), next_log_prob, alpha)
        return sac_critic_loss(q[0], q[1], target)

    def actor_loss(self, batch: Transitions, noise: Tensor, norm: Norm
                   ) -> tuple[Tensor, dict[str, Tensor]]:
        """The actor loss (critics read as constants, with their running statistics) plus
        the temperature's."""
        m = self.module()
        alpha = m.log_alpha.detach().exp()
        action, log_prob = m.actor(batch.obs, noise=noise, norm=norm)
        q_pi = m.critic(batch.obs, action, detach_params=True)
        loss, stats = sac_actor_loss(q_pi[0], q_pi[1], log_prob, alpha)
        return self.plus_alpha_loss(loss, stats, m, log_prob)

    def update(self, batch: Transitions) -> dict[str, Tensor]:
        """One critic step (and actor + alpha step when due); the policy noise is drawn
        next actions first, then the batch's (when due), as sb3-contrib draws it."""
        shape = (len(batch), self.module().actor.act_dim)
        critic_norm, actor_norm = self.norms()
        loss, stats = self.critic_loss(batch, standard_normal(shape, batch.reward,
                                                              self.generator), critic_norm)
        self.step(loss)
        if self.actor_update_due():
            if self.on_nonfinite == "raise" and bool(self.step.flag):
                raise self.nonfinite_error("critic loss or gradient")
            flag, skipped = self.step.flag, self.step.skipped  # set by the critic's step
            assert flag is not None and skipped is not None
            critic_skipped = flag.clone()
            loss, actor_stats = self.actor_loss(batch, standard_normal(
                shape, batch.reward, self.generator), actor_norm)
            self.step(loss)
            # one update skipped in both its steps counts once (on the device, no sync)
            skipped.sub_(critic_skipped * flag)
            stats.update(actor_stats)
        self.after_update()
        return stats

    def target_update_every(self) -> int:
        return 1

    def update_targets(self, module_id: str) -> None:
        """Nothing: CrossQ has no target networks."""


class CrossQ(SAC):
    """SAC's acting and cadence with CrossQ's networks and update."""

    name = "crossq"
    config: CrossQConfig
    module_cls = CrossQModule
    learner_cls = CrossQLearner

