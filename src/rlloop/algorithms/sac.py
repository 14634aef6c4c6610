"""Soft actor-critic with automatic entropy tuning (Haarnoja et al. 2018, arXiv:1812.05905).

Twin Q critics with Polyak-averaged targets, a tanh-squashed Gaussian actor, and a
learned temperature ``alpha``: three optimisers, ``"actor"``, ``"critic"`` and
``"alpha"``, registered on one module. The losses are the pure functions of
:mod:`rlloop.losses.sac`.

One update takes a single backward pass over ``critic + actor + alpha`` losses. That
is exact, not an approximation: the actor loss reads the critics with detached weights
(``TwinQ(..., detach_params=True)``), the TD target is computed without gradient and
the alpha and actor losses detach each other's inputs, so every optimiser receives the
gradient of its own loss only (``tests/algorithms/test_sac_td3.py`` checks it). All three losses
see the parameters from before the update, as in the paper's simultaneous updates.

With ``use_sde`` the actor explores by generalised state-dependent exploration
(:mod:`rlloop.modules.gsde`): each env keeps a noise matrix, drawn afresh at the start
of every rollout (the env steps between two optimisation steps) and every
``sde_sample_freq`` env steps; each gradient update draws one matrix for its batch, as
Stable-Baselines3 does.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping
from typing import Any, cast

import torch
from torch import Tensor, nn

from rlloop.algorithms.base import EnvSettings
from rlloop.algorithms.offpolicy_base import (
    OffPolicyAlgorithmBase,
    OffPolicyLearnerBase,
    continuous_actions,
)
from rlloop.algorithms.offpolicy_loop import (
    OffPolicyLoop,
    unit_box,
)
from rlloop.config.offpolicy import SACConfig as SACConfig
from rlloop.data.transitions import Transitions
from rlloop.envs.core import EnvSpec
from rlloop.errors import ConfigError
from rlloop.learners.learner import DEFAULT_MODULE_ID
from rlloop.losses.polyak import polyak_update
from rlloop.losses.sac import sac_actor_loss, sac_alpha_loss, sac_critic_loss, sac_target
from rlloop.modules.encoders import Encoder, build_encoder
from rlloop.modules.gsde import TanhGSDEActor
from rlloop.modules.networks import flat_dim
from rlloop.modules.q_networks import TanhGaussianActor, TwinQ, standard_normal
from rlloop.system.devices import build_module


class SACModule(nn.Module):
    """Actor, twin critics, their Polyak target and ``log alpha``."""

    def __init__(self, obs_dim: int, act_dim: int, config: SACConfig,
                 encoder: Callable[[], Encoder | None] = lambda: None) -> None:
        super().__init__()
        # Actor and critic each get their own encoder (SB3's share_features_extractor=False).
        actor_encoder = encoder()
        self.actor: TanhGaussianActor | TanhGSDEActor
        if config.use_sde:
            if actor_encoder is not None:
                s = config.section
                raise ConfigError(f"{s}.use_sde needs vector observations (gSDE's noise acts "
                                  f"on an MLP's features); drop {s}.use_sde or set "
                                  f"{s}.encoder=mlp")
            self.actor = TanhGSDEActor(obs_dim, act_dim, config.hidden, config.init_log_std,
                                       config.full_std, config.use_expln)
        else:
            self.actor = TanhGaussianActor(obs_dim, act_dim, config.hidden, actor_encoder)
        self.critic = self.build_critic(obs_dim, act_dim, config, encoder())
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.log_alpha = nn.Parameter(torch.tensor(math.log(config.init_alpha)),
                                      requires_grad=config.autotune_alpha)

    def build_critic(self, obs_dim: int, act_dim: int, config: SACConfig,
                     encoder: Encoder | None) -> TwinQ:
        """The twin Q critics (TQC's module builds quantile critics here)."""
        return TwinQ(obs_dim, act_dim, config.hidden, encoder=encoder)


def sac_module_factory(spec: EnvSpec, act_dim: int, config: SACConfig,
                       module_cls: type[SACModule] = SACModule) -> Callable[[], SACModule]:
    """What builds SAC's module for ``spec`` (every learner rank builds its copy so)."""
    return lambda: module_cls(flat_dim(spec.obs_shape), act_dim, config, lambda: build_encoder(
        config.section, config.network_encoder, spec.obs_shape, spec.image_obs, spec.obs_parts,
        config.hidden, cnn_precision=config.cnn_precision,
        standardized=config.normalize_obs))


def add_actor_critic_adams(learner: Any, module_id: str, module: nn.Module, lr: float,
                           autotune_alpha: bool) -> None:
    """One Adam each for ``module``'s actor and critic, and its ``log_alpha`` when tuned."""
    actor, critic = cast(nn.Module, module.actor), cast(nn.Module, module.critic)
    groups: list[tuple[str, list[Tensor]]] = [("actor", list(actor.parameters())),
                                              ("critic", list(critic.parameters()))]
    if autotune_alpha:
        groups.append(("alpha", [cast(Tensor, module.log_alpha)]))
    for name, params in groups:
        learner.add_adam(module_id, name, params, lr)


class SACLearner(OffPolicyLearnerBase):
    """Registers ``actor``, ``critic`` and ``alpha`` optimisers; one backward per update.

    The policy's noise is drawn from ``generator`` before the losses (next actions first,
    then the batch's), so a compiled update sees tensors only.
    """

    def __init__(self, modules: Mapping[str, SACModule], config: SACConfig,
                 target_entropy: float, generator: torch.Generator,
                 on_nonfinite: str = "skip") -> None:
        self.target_entropy = target_entropy
        self.generator = generator
        super().__init__(modules, config, on_nonfinite=on_nonfinite)

    def module(self, module_id: str = DEFAULT_MODULE_ID) -> SACModule:
        return cast(SACModule, self.modules[module_id])

    def configure_optimizers_for_module(self, module_id: str, config: SACConfig) -> None:
        add_actor_critic_adams(self, module_id, self.module(module_id), config.lr,
                               config.autotune_alpha)

    def _noise(self, m: SACModule, batch: Transitions) -> tuple[Tensor, Tensor]:
        """The policy's standard normal draws ``[B, d]`` at ``next_obs`` and at ``obs``;
        with gSDE one noise matrix ``[latent, d]`` serves both (as in SB3)."""
        if isinstance(m.actor, TanhGSDEActor):
            eps = m.actor.sde.sample_eps((), self.generator)
            return eps, eps
        shape = (len(batch), m.actor.act_dim)
        return (standard_normal(shape, batch.reward, self.generator),
                standard_normal(shape, batch.reward, self.generator))

    def compute_loss_for_module(self, module_id: str, config: SACConfig,
                                batch: Transitions, fwd_out: Any = None
                                ) -> tuple[Tensor, dict[str, Tensor]]:
        m = self.module(module_id)
        return self._loss(m, batch, *self._noise(m, batch))

    def _loss(self, m: SACModule, batch: Transitions, next_noise: Tensor, noise: Tensor
              ) -> tuple[Tensor, dict[str, Tensor]]:
        """Critic + actor (+ alpha) loss and their stats."""
        alpha = m.log_alpha.detach().exp()
        with torch.no_grad():
            next_action, next_log_prob = m.actor(batch.next_obs, noise=next_noise)
            next_q = m.critic_target(batch.next_obs, next_action)
            target = sac_target(batch.reward, batch.discount, batch.terminated, next_q[0],
                                next_q[1], next_log_prob, alpha)
        q = m.critic(batch.obs, batch.action)
        action, log_prob = m.actor(batch.obs, noise=noise)
        q_pi = m.critic(batch.obs, action, detach_params=True)
        loss, stats = sac_critic_loss(q[0], q[1], target)
        actor_loss, actor_stats = sac_actor_loss(q_pi[0], q_pi[1], log_prob, alpha)
        stats.update(actor_stats)
        return self.plus_alpha_loss(loss + actor_loss, stats, m, log_prob)

    def plus_alpha_loss(self, loss: Tensor, stats: dict[str, Tensor], m: SACModule,
                        log_prob: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        """``loss`` plus the temperature's loss at ``log_prob`` when alpha is tuned, and
        ``stats`` with its stats."""
        if self.config.autotune_alpha:
            alpha_loss, alpha_stats = sac_alpha_loss(m.log_alpha, log_prob, self.target_entropy)
            loss = loss + alpha_loss
            stats.update(alpha_stats)
        return loss, stats

    def update(self, batch: Transitions) -> dict[str, Tensor]:
        """One gradient update of every optimiser (one backward pass), then the targets."""
        m = self.module()
        if (whole := self.whole_update(m, self._loss)) is not None:
            stats = whole(batch, *self._noise(m, batch))
        else:
            stats = self.compiled(self._loss_step)(batch, *self._noise(m, batch))
        self.after_update()
        return cast(dict[str, Tensor], stats)

    def _loss_step(self, batch: Transitions, next_noise: Tensor, noise: Tensor
                   ) -> dict[str, Tensor]:
        loss, stats = self._loss(self.module(), batch, next_noise, noise)
        self.step(loss)
        return stats

    def target_update_every(self) -> int:
        return int(self.config.target_update_interval)

    def update_targets(self, module_id: str) -> None:
        m = self.module(module_id)
        polyak_update(m.critic_target, m.critic, self.config.tau)


class SAC(OffPolicyAlgorithmBase):
    """SAC on the off-policy cadence; actions live in ``[-1, 1]`` and are rescaled for the env."""

    name = "sac"
    config: SACConfig
    learner: SACLearner
    #: The module and learner classes (TQC subclasses both and keeps the rest).
    module_cls: type[SACModule] = SACModule
    learner_cls: type[SACLearner] = SACLearner

    def __init__(self, config: SACConfig, env: EnvSettings) -> None:
        space, to_env = continuous_actions(self.name, env)
        super().__init__(self.name, env, config)
        self.config = config
        self.space = space
        entropy = -float(space.dim) if config.target_entropy is None else config.target_entropy
        self.module = build_module(sac_module_factory(env.spec, space.dim, config,
                                                      self.module_cls), self.device)
        self.learner = self.learner_cls({DEFAULT_MODULE_ID: self.module}, config, entropy,
                                        self.generator, env.on_nonfinite)
        self.loop = OffPolicyLoop(self.runner, config, unit_box(space), self.generator, to_env,
                                  random_warmup=not (config.use_sde and config.use_sde_at_warmup),
                                  obs_stats=self.obs_stats)
        self.to_env = to_env
        actor = self.module.actor
        #: gSDE: each env's noise matrix (standard normal, scaled by sigma when used), and
        #: the explore steps since the rollout began.
        self._sde_eps = (torch.zeros(env.num_envs, actor.sde.latent_dim, space.dim,
                                     device=self.device)
                         if isinstance(actor, TanhGSDEActor) else None)
        self._sde_age = 0

    # ---- acting ----------------------------------------------------------------------
    def _explore(self, obs: Tensor) -> Tensor:
        actor = self.module.actor
        if not isinstance(actor, TanhGSDEActor):
            return actor.sample(obs, self.generator).view(-1, *self.space.shape)
        freq = self.config.sde_sample_freq
        if self._sde_age == 0 or (freq > 0 and self._sde_age % freq == 0):
            self._sde_eps = actor.sde.sample_eps((len(obs),), self.generator)
        self._sde_age += 1
        return actor.sample(obs, noise=self._sde_eps).view(-1, *self.space.shape)

    def optimize(self, env_steps: int) -> dict[str, Tensor | float] | None:
        """As the base class; with gSDE the next env step starts a new rollout."""
        stats = super().optimize(env_steps)
        self.start_rollout()
        return stats

    def start_rollout(self) -> None:
        self._sde_age = 0  # sde_sample_freq=-1 draws new noise matrices at the next step

    @torch.no_grad()
    def act(self, obs: Tensor, deterministic: bool = True) -> Tensor:
        """Env-scaled actions: ``tanh(mean)``, or a sample (from an eval-only RNG)."""
        actor = self.module.actor
        action = actor.mode(obs) if deterministic else actor.sample(obs, self._eval_generator)
        return self.to_env(action.view(-1, *self.space.shape))

    def get_state(self) -> dict[str, Any]:
        state = super().get_state()
        if self._sde_eps is not None:
            state["sde"] = {"eps": self._sde_eps.clone(), "age": self._sde_age}
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        super().set_state(state)
        if self._sde_eps is not None and "sde" in state:
            self._sde_eps = state["sde"]["eps"].to(self.device, copy=True)
            self._sde_age = int(state["sde"]["age"])
