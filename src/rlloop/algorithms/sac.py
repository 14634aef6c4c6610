"""Soft actor-critic with automatic entropy tuning (Haarnoja et al. 2018, arXiv:1812.05905).

Twin Q critics with Polyak-averaged targets, a tanh-squashed Gaussian actor, and a
learned temperature ``alpha``: three optimisers, ``"actor"``, ``"critic"`` and
``"alpha"``, registered on one module. The losses are the pure functions of
:mod:`rlloop.losses.sac`.

One update takes a single backward pass over ``critic + actor + alpha`` losses. That
is exact, not an approximation: the actor loss reads the critics with detached weights
(``TwinQ(..., detach_params=True)``), the TD target is computed without gradient and
the alpha and actor losses detach each other's inputs, so every optimiser receives the
gradient of its own loss only (``tests/test_sac_td3.py`` checks it). All three losses
see the parameters from before the update, as in the paper's simultaneous updates.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, cast

import torch
from torch import Tensor, nn

from rlloop.algorithms.base import EnvSettings
from rlloop.algorithms.offpolicy import (
    OffPolicyConfig,
    OffPolicyLoop,
    ReplayBatch,
    check_hidden,
    unit_box,
)
from rlloop.algorithms.offpolicy_algorithm import (
    OffPolicyAlgorithmBase,
    OffPolicyLearnerBase,
    continuous_actions,
)
from rlloop.devices import build_module
from rlloop.errors import ConfigError
from rlloop.learners.learner import DEFAULT_MODULE_ID
from rlloop.learners.mlp_backprop import MLPBackprop, TwinMLPBackprop
from rlloop.losses.polyak import polyak_update
from rlloop.losses.sac import (
    sac_actor_loss,
    sac_actor_loss_grad,
    sac_alpha_loss,
    sac_alpha_loss_grad,
    sac_critic_loss,
    sac_critic_loss_grad,
    sac_target,
)
from rlloop.modules.networks import flat_dim
from rlloop.modules.q_networks import TanhGaussianActor, TwinQ, tanh_gaussian_grad


@dataclass
class SACConfig(OffPolicyConfig):
    """SAC hyperparameters (defaults: Stable-Baselines3's SAC defaults)."""

    section: ClassVar[str] = "sac"

    lr: float = 3e-4
    """Adam learning rate of the actor, the critics and alpha."""
    tau: float = 0.005
    """Polyak coefficient of the target critics."""
    target_update_interval: int = 1
    """Gradient updates between target-critic updates."""
    init_alpha: float = 1.0
    """Initial entropy temperature."""
    autotune_alpha: bool = True
    """Learn alpha so that the policy entropy tracks target_entropy."""
    target_entropy: float | None = None
    """Entropy target of the alpha loss (None: -action_dim)."""
    hidden: list[int] = field(default_factory=lambda: [256, 256])
    """Hidden layer sizes of the actor and of each critic (ReLU)."""
    fused_update: bool = True
    """Compute the gradients with hand-derived backward passes (rlloop.learners.
    mlp_backprop; same maths, a fraction of autograd's overhead). False: autograd."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.lr <= 0 or self.init_alpha <= 0:
            raise ConfigError(f"sac.lr and sac.init_alpha must be > 0, got {self.lr}, "
                              f"{self.init_alpha}")
        if not 0 < self.tau <= 1:
            raise ConfigError(f"sac.tau must be in (0, 1], got {self.tau}")
        if self.target_update_interval <= 0:
            raise ConfigError("sac.target_update_interval must be > 0")
        check_hidden("sac", self.hidden)


class SACModule(nn.Module):
    """Actor, twin critics, their Polyak target and ``log alpha``."""

    def __init__(self, obs_dim: int, act_dim: int, config: SACConfig) -> None:
        super().__init__()
        self.actor = TanhGaussianActor(obs_dim, act_dim, config.hidden)
        self.critic = TwinQ(obs_dim, act_dim, config.hidden)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.log_alpha = nn.Parameter(torch.tensor(math.log(config.init_alpha)),
                                      requires_grad=config.autotune_alpha)


class SACLearner(OffPolicyLearnerBase):
    """Registers ``actor``, ``critic`` and ``alpha`` optimisers; one backward per update.

    With ``fused_update`` (one module) the backward pass is derived by hand: the pure
    gradient functions of :mod:`rlloop.losses.sac`, :func:`tanh_gaussian_grad` and the
    backprops of :mod:`rlloop.learners.mlp_backprop`. Same samples, same maths.
    """

    def __init__(self, modules: Mapping[str, SACModule], config: SACConfig,
                 target_entropy: float, generator: torch.Generator,
                 on_nonfinite: str = "skip") -> None:
        self.target_entropy = target_entropy
        self.generator = generator
        self.backprop: tuple[MLPBackprop, TwinMLPBackprop] | None = None
        if config.fused_update and len(modules) == 1:
            m = next(iter(modules.values()))
            self.backprop = (MLPBackprop(m.actor.net), TwinMLPBackprop(m.critic))
        super().__init__(modules, config, on_nonfinite=on_nonfinite)

    def module(self, module_id: str = DEFAULT_MODULE_ID) -> SACModule:
        return cast(SACModule, self.modules[module_id])

    def configure_optimizers_for_module(self, module_id: str, config: SACConfig) -> None:
        m = self.module(module_id)
        groups: list[tuple[str, list[Tensor]]] = [("actor", list(m.actor.parameters())),
                                                  ("critic", list(m.critic.parameters()))]
        if config.autotune_alpha:
            groups.append(("alpha", [m.log_alpha]))
        for name, params in groups:
            self.add_adam(module_id, name, params, config.lr)

    def _target(self, m: SACModule, batch: ReplayBatch, alpha: Tensor) -> Tensor:
        with torch.no_grad():
            next_action, next_log_prob = m.actor(batch.next_obs, self.generator)
            next_q = m.critic_target(batch.next_obs, next_action)
            return sac_target(batch.reward, batch.discount, batch.terminated, next_q[0],
                              next_q[1], next_log_prob, alpha)

    def compute_loss_for_module(self, module_id: str, config: SACConfig,
                                batch: ReplayBatch, fwd_out: Any = None
                                ) -> tuple[Tensor, dict[str, Tensor]]:
        m = self.module(module_id)
        alpha = m.log_alpha.detach().exp()
        target = self._target(m, batch, alpha)
        q = m.critic(batch.obs, batch.action)
        action, log_prob = m.actor(batch.obs, self.generator)
        q_pi = m.critic(batch.obs, action, detach_params=True)
        return self._losses(m, q, target, q_pi, log_prob, alpha)

    def _losses(self, m: SACModule, q: Tensor, target: Tensor, q_pi: Tensor, log_prob: Tensor,
                alpha: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        """Critic + actor (+ alpha) loss and their stats, from the critics at the batch's
        actions (``q``) and at the policy's (``q_pi``), both ``[2, B]``."""
        loss, stats = sac_critic_loss(q[0], q[1], target)
        actor_loss, actor_stats = sac_actor_loss(q_pi[0], q_pi[1], log_prob, alpha)
        loss = loss + actor_loss
        stats.update(actor_stats)
        if self.config.autotune_alpha:
            alpha_loss, alpha_stats = sac_alpha_loss(m.log_alpha, log_prob, self.target_entropy)
            loss = loss + alpha_loss
            stats.update(alpha_stats)
        return loss, stats

    def update(self, batch: ReplayBatch) -> dict[str, Tensor]:
        """One gradient update of every optimiser (one backward pass), then the targets."""
        if self.backprop is not None:
            return self._fused_update(batch)
        return super().update(batch)

    def _fused_update(self, batch: ReplayBatch) -> dict[str, Tensor]:
        """``update`` with the gradients derived by hand; the random draws, losses and
        optimiser steps are those of the autograd path."""
        assert self.backprop is not None
        actor_bp, critic_bp = self.backprop
        m, cfg = self.module(), self.config
        alpha = m.log_alpha.detach().exp()
        target = self._target(m, batch, alpha)
        q, critic_inputs = critic_bp.forward(batch.obs, batch.action)
        out, actor_inputs = actor_bp.forward(batch.obs.flatten(1))
        action, log_prob, sample = m.actor.head(out, self.generator)
        q_pi, pi_inputs = critic_bp.forward(batch.obs, action)
        loss, stats = self._losses(m, q, target, q_pi, log_prob, alpha)
        if not bool(torch.isfinite(loss)):
            return self._skip("loss", stats)
        grad_q_pi, grad_log_prob = sac_actor_loss_grad(q_pi, alpha)
        grad_input = critic_bp.backward(pi_inputs, grad_q_pi, params=False, input_grad=True)
        assert grad_input is not None
        grad_action = grad_input[:, grad_input.shape[1] - action.shape[1]:]
        actor_bp.backward(actor_inputs, tanh_gaussian_grad(sample, grad_action, grad_log_prob))
        critic_bp.backward(critic_inputs, sac_critic_loss_grad(q, target))
        if cfg.autotune_alpha:
            m.log_alpha.grad = sac_alpha_loss_grad(log_prob, self.target_entropy)
        self.step_optimizers()
        return stats

    def target_update_every(self) -> int:
        return int(self.config.target_update_interval)

    def update_targets(self, module_id: str) -> None:
        m = self.module(module_id)
        polyak_update(m.critic_target, m.critic, self.config.tau)


class SAC(OffPolicyAlgorithmBase):
    """SAC on border's cadence; actions live in ``[-1, 1]`` and are rescaled for the env."""

    name = "sac"
    config: SACConfig
    learner: SACLearner

    def __init__(self, config: SACConfig, env: EnvSettings) -> None:
        space, to_env = continuous_actions("sac", env)
        super().__init__("sac", env)
        self.config = config
        self.space = space
        entropy = -float(space.dim) if config.target_entropy is None else config.target_entropy
        self.module = build_module(lambda: SACModule(flat_dim(env.spec.obs_shape), space.dim,
                                                     config), self.device)
        self.learner = SACLearner({DEFAULT_MODULE_ID: self.module}, config, entropy,
                                  self.generator, env.on_nonfinite)
        self.loop = OffPolicyLoop(self.runner, config, unit_box(space), self.generator, to_env)
        self.to_env = to_env

    # ---- acting ----------------------------------------------------------------------
    def _explore(self, obs: Tensor) -> Tensor:
        return self.module.actor(obs, self.generator)[0].view(-1, *self.space.shape)

    @torch.no_grad()
    def act(self, obs: Tensor, deterministic: bool = True) -> Tensor:
        """Env-scaled actions: ``tanh(mean)``, or a sample (from an eval-only RNG)."""
        actor = self.module.actor
        action = actor.mode(obs) if deterministic else actor(obs, self._eval_generator)[0]
        return self.to_env(action.view(-1, *self.space.shape))
