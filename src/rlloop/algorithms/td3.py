"""TD3 (Fujimoto et al. 2018, arXiv:1802.09477): twin Q critics, delayed actor updates and
target policy smoothing; the losses are the pure functions of :mod:`rlloop.losses.td3`.

Every ``policy_delay``-th update also updates the actor (on ``Q1`` read with detached
critic weights, so one backward pass serves both optimisers) and Polyak-averages the
actor and critic targets. Exploration adds action noise (Gaussian, Ornstein-Uhlenbeck or
none: :mod:`rlloop.modules.action_noise`) to ``mu(s)`` in the normalised action box
``[-1, 1]``, clipped to it.
"""

from __future__ import annotations

import copy
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
from rlloop.config.offpolicy import TD3Config as TD3Config
from rlloop.data.transitions import Transitions
from rlloop.learners.learner import DEFAULT_MODULE_ID
from rlloop.losses.polyak import polyak_update
from rlloop.losses.td3 import smoothed_target_action, td3_actor_loss, td3_critic_loss, td3_target
from rlloop.modules.action_noise import make_action_noise
from rlloop.modules.encoders import Encoder, build_encoder
from rlloop.modules.networks import flat_dim
from rlloop.modules.q_networks import DeterministicActor, TwinQ, standard_normal
from rlloop.system.devices import build_module


class TD3Module(nn.Module):
    """Actor, twin critics and their Polyak targets."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: list[int],
                 encoder: Callable[[], Encoder | None] = lambda: None) -> None:
        super().__init__()
        self.actor = DeterministicActor(obs_dim, act_dim, hidden, encoder())
        self.actor_target = copy.deepcopy(self.actor).requires_grad_(False)
        self.critic = TwinQ(obs_dim, act_dim, hidden, encoder=encoder())
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)


class TD3Learner(OffPolicyLearnerBase):
    """Registers ``actor`` and ``critic`` optimisers; the actor term joins every
    ``policy_delay``-th loss."""

    def __init__(self, modules: Mapping[str, TD3Module], config: TD3Config,
                 generator: torch.Generator, on_nonfinite: str = "skip") -> None:
        self.generator = generator
        super().__init__(modules, config, on_nonfinite=on_nonfinite)

    def module(self, module_id: str = DEFAULT_MODULE_ID) -> TD3Module:
        return cast(TD3Module, self.modules[module_id])

    def policy_update_due(self) -> bool:
        """Whether the coming update is a delayed actor update (updates d, 2d, ...)."""
        return (self.updates + 1) % self.config.policy_delay == 0

    def configure_optimizers_for_module(self, module_id: str, config: TD3Config) -> None:
        m = self.module(module_id)
        for name, part in (("actor", m.actor), ("critic", m.critic)):
            self.add_adam(module_id, name, list(part.parameters()), config.lr)

    def compute_loss_for_module(self, module_id: str, config: TD3Config,
                                batch: Transitions, fwd_out: Any = None
                                ) -> tuple[Tensor, dict[str, Tensor]]:
        m = self.module(module_id)
        return self._loss(m, batch, self._noise(m, batch), self.policy_update_due())

    def _noise(self, m: TD3Module, batch: Transitions) -> Tensor:
        """The target smoothing's standard normal draw ``[B, d]``."""
        return standard_normal((len(batch), m.actor.act_dim), batch.reward, self.generator)

    def _loss(self, m: TD3Module, batch: Transitions, noise: Tensor, actor: bool
              ) -> tuple[Tensor, dict[str, Tensor]]:
        """The critic loss, plus the actor's when ``actor`` (a delayed update)."""
        cfg = self.config
        with torch.no_grad():
            next_action = smoothed_target_action(
                m.actor_target(batch.next_obs), cfg.target_policy_noise,
                cfg.target_noise_clip, -1.0, 1.0, noise=noise)
            next_q = m.critic_target(batch.next_obs, next_action)
            target = td3_target(batch.reward, batch.discount, batch.terminated, next_q[0],
                                next_q[1])
        q = m.critic(batch.obs, batch.action)
        loss, stats = td3_critic_loss(q[0], q[1], target)
        if actor:
            q1_pi = m.critic(batch.obs, m.actor(batch.obs), detach_params=True, member=0)[0]
            actor_loss, actor_stats = td3_actor_loss(q1_pi)
            loss = loss + actor_loss
            stats.update(actor_stats)
        return loss, stats

    def update(self, batch: Transitions) -> dict[str, Tensor]:
        """One critic update (and actor update when due), then the targets when due."""
        m = self.module()
        actor = self.policy_update_due()
        if (whole := self.whole_update(m, self._loss)) is not None:
            stats = whole(batch, self._noise(m, batch), actor,
                          idle=None if actor else m.actor)
        else:
            stats = self.compiled(self._loss_step)(batch, self._noise(m, batch), actor)
        self.after_update()
        return cast(dict[str, Tensor], stats)

    def _loss_step(self, batch: Transitions, noise: Tensor, actor: bool) -> dict[str, Tensor]:
        loss, stats = self._loss(self.module(), batch, noise, actor)
        self.step(loss)
        return stats

    def target_update_every(self) -> int:
        return int(self.config.policy_delay)  # after each delayed actor update

    def update_targets(self, module_id: str) -> None:
        m = self.module(module_id)
        polyak_update(m.critic_target, m.critic, self.config.tau)
        polyak_update(m.actor_target, m.actor, self.config.tau)


class TD3(OffPolicyAlgorithmBase):
    """TD3 on the off-policy cadence; actions live in ``[-1, 1]`` and are rescaled for the env."""

    name = "td3"
    config: TD3Config
    learner: TD3Learner

    def __init__(self, config: TD3Config, env: EnvSettings) -> None:
        space, to_env = continuous_actions("td3", env)
        super().__init__("td3", env, config)
        self.config = config
        self.space = space
        spec = env.spec
        self.module = build_module(lambda: TD3Module(
            flat_dim(spec.obs_shape), space.dim, config.hidden, lambda: build_encoder(
                "td3", config.network_encoder, spec.obs_shape, spec.image_obs, spec.obs_parts,
                config.hidden, cnn_precision=config.cnn_precision,
                standardized=config.normalize_obs)), self.device)
        self.learner = TD3Learner({DEFAULT_MODULE_ID: self.module}, config, self.generator,
                                  env.on_nonfinite)
        self.noise = make_action_noise(config.action_noise, env.num_envs, space.dim,
                                       config.action_noise_std, self.generator,
                                       config.ou_theta, config.ou_dt)
        self.loop = OffPolicyLoop(self.runner, config, unit_box(space), self.generator, to_env,
                                  on_done=self.noise.episode_end,
                                  obs_stats=self.obs_stats)
        self.to_env = to_env

    # ---- acting ----------------------------------------------------------------------
    def _explore(self, obs: Tensor) -> Tensor:
        action = (self.module.actor(obs) + self.noise.sample()).clamp_(-1.0, 1.0)
        return action.view(-1, *self.space.shape)

    @torch.no_grad()
    def act(self, obs: Tensor, deterministic: bool = True) -> Tensor:
        """Env-scaled actions: ``mu(s)``, or with Gaussian noise of ``action_noise_std``
        (from an eval-only RNG, so evaluating never moves the training noise)."""
        action = self.module.actor(obs)
        if not deterministic:
            noise = torch.randn(action.shape, generator=self._eval_generator,
                                device=action.device)
            action = (action + noise * self.config.action_noise_std).clamp_(-1.0, 1.0)
        return self.to_env(action.view(-1, *self.space.shape))

    def get_state(self) -> dict[str, Any]:
        return {**super().get_state(), "action_noise": self.noise.get_state()}

    def set_state(self, state: dict[str, Any]) -> None:
        super().set_state(state)
        self.noise.set_state(state.get("action_noise", {}))
