"""DQN (Mnih et al. 2015, Nature 518) with the double-DQN target (van Hasselt et al. 2016),
a dueling head (Wang et al. 2016), n-step transitions and prioritized replay as options.

The loss is :func:`rlloop.losses.dqn.dqn_loss` (Huber). Epsilon decays linearly on the
env-step timeline. The target network is updated every ``target_update_interval``
gradient updates: copied (``tau = 1``) or Polyak-averaged (``tau < 1``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any, cast

import torch
from torch import Tensor, nn

from rlloop.algorithms.base import EnvSettings
from rlloop.algorithms.offpolicy_base import OffPolicyAlgorithmBase, OffPolicyLearnerBase
from rlloop.algorithms.offpolicy_loop import OffPolicyLoop
from rlloop.config.offpolicy import DQNConfig as DQNConfig
from rlloop.config.schedules import Linear
from rlloop.data.prioritized_replay import PrioritizedReplayBuffer
from rlloop.data.transitions import Transitions
from rlloop.envs.action_masks import legal_actions, resolve_action_mask
from rlloop.envs.core import Discrete, sample_random_actions
from rlloop.errors import ConfigError
from rlloop.learners.adam import Adam
from rlloop.learners.learner import DEFAULT_MODULE_ID
from rlloop.learners.mlp_backprop import (
    DQNBackprop,
    dqn_backprop,
    huber_loss,
    plain_relu_q_network,
)
from rlloop.learners.update_loop import scripted_updates
from rlloop.losses.dqn import dqn_loss, dqn_stats, dqn_target
from rlloop.losses.polyak import hard_update, polyak_update
from rlloop.modules.encoders import Encoder, build_encoder, flat_input
from rlloop.modules.masked import random_legal_actions
from rlloop.modules.networks import flat_dim
from rlloop.modules.q_networks import QNetwork
from rlloop.system.devices import build_module


class DQNModule(nn.Module):
    """The online Q-network and its target network (a copy that gets no gradient)."""

    def __init__(self, online: nn.Module) -> None:
        super().__init__()
        self.online = online
        self.target = copy.deepcopy(online).requires_grad_(False)


class DQNLearner(OffPolicyLearnerBase):
    """Adam on the online network; Huber TD loss; target updates on a fixed cadence.

    With ``manual_backward`` (by default on a CPU, without ``compile``) and a plain ReLU
    Q-network (one module), the gradient comes from
    :class:`~rlloop.learners.mlp_backprop.DQNBackprop` instead of autograd.
    """

    transient_attrs = frozenset({"td_errors"})

    def __init__(self, modules: Mapping[str, DQNModule], config: DQNConfig,
                 on_nonfinite: str = "skip") -> None:
        self.td_errors: Tensor | None = None  # of the last batch, for prioritized replay
        self.backprop: DQNBackprop | None = None  # the opt-in hand-derived gradient
        super().__init__(modules, config, on_nonfinite=on_nonfinite)

    def module(self, module_id: str = DEFAULT_MODULE_ID) -> DQNModule:
        return cast(DQNModule, self.modules[module_id])

    def configure_optimizers_for_module(self, module_id: str, config: DQNConfig) -> None:
        online = self.module(module_id).online
        if len(self.modules) == 1 and manual_backward(config, online):
            self.backprop = dqn_backprop(online)
        # The hand-derived pass writes every gradient on every update: its parameters,
        # gradients and Adam's state can live in flat buffers (fewer, larger ops per step).
        self.add_adam(module_id, "default", list(online.parameters()), config.lr,
                      config.max_grad_norm, config.adam_eps, flat=self.backprop is not None)

    def compute_loss_for_module(self, module_id: str, config: DQNConfig,
                                batch: Transitions, fwd_out: Any = None
                                ) -> tuple[Tensor, dict[str, Tensor]]:
        m = self.module(module_id)
        loss, stats, self.td_errors = dqn_loss(m.online(batch.obs), batch.action,
                                               self._td_target(m, batch), batch.weights)
        return loss, stats

    def _td_target(self, m: DQNModule, batch: Transitions) -> Tensor:
        """The TD target of ``batch`` (double DQN's when configured), without gradient."""
        with torch.no_grad():
            next_online = m.online(batch.next_obs) if self.config.double_q else None
            return dqn_target(batch.reward, batch.discount, batch.terminated,
                              m.target(batch.next_obs), next_online)

    def update(self, batch: Transitions) -> dict[str, Tensor]:
        """One gradient update of the (single) module, then the target cadence."""
        return self.update_towards(batch.obs, batch.action,
                                   self._td_target(self.module(), batch), batch.weights)

    def updates_with_fixed_target(self, limit: int) -> int:
        """How many of the next ``limit`` updates see the current target network.

        Zero when each update needs its own target pass: double DQN (the online network
        picks the next action and changes with every update).
        """
        if self.config.double_q:
            return 0
        return min(limit, self.config.target_update_interval
                   - self.updates % self.config.target_update_interval)

    @torch.no_grad()
    def targets(self, batch: Transitions, chunk: int = 1024) -> Tensor:
        """TD targets ``[B]`` from the current target network, ``chunk`` rows per pass
        (small enough that the activations stay in cache and reuse freed memory)."""
        m = self.module()
        next_q = torch.cat([m.target(x) for x in batch.next_obs.split(chunk)])
        return dqn_target(batch.reward, batch.discount, batch.terminated, next_q)

    def updates_towards(self, obs: Tensor, action: Tensor, target: Tensor, k: int, *,
                        stats: bool) -> dict[str, Tensor]:
        """``k`` updates on ``k`` equal batches of these rows, in order, whose TD targets
        were computed already (the target network stays fixed across them); the last
        one's stats where ``stats``. One call for all of them where
        :func:`~rlloop.learners.update_loop.scripted_updates` runs them, else one by one."""
        run = self._update_loop()
        if run is None:
            out: dict[str, Tensor] = {}
            for i, (o, a, y) in enumerate(zip(obs.chunk(k), action.chunk(k), target.chunk(k),
                                              strict=True)):
                out = self.update_towards(o, a, y, stats=stats and i == k - 1)
            return out
        assert self.backprop is not None
        rows = obs.shape[0] // k
        q, self.td_errors = run(flat_input(obs, self.backprop.mlp.dtype).reshape(k, rows, -1),
                                action.long().reshape(k, rows, 1), target.reshape(k, rows))
        for _ in range(k):
            self.after_update()
        return dqn_stats(huber_loss(self.td_errors), q, self.td_errors) if stats else {}

    def _update_loop(self) -> Callable[[Tensor, Tensor, Tensor], tuple[Tensor, Tensor]] | None:
        """The scripted run of several hand-derived updates, where it applies (see
        :mod:`rlloop.learners.update_loop`)."""
        if self.backprop is None or self.on_nonfinite == "raise" or len(self.step.optims) != 1:
            return None
        optim = self.step.optims[0]
        adam = optim.optimizer.flat_step() if isinstance(optim.optimizer, Adam) else None
        if adam is None or self.step.flag is None or self.step.skipped is None:
            return None
        layers = self.backprop.backprop.layers
        return scripted_updates([layer.weight for layer in layers],
                                [layer.bias for layer in layers], adam, self.step.flag,
                                self.step.skipped, optim.max_grad_norm)

    def update_towards(self, obs: Tensor, action: Tensor, target: Tensor,
                       weights: Tensor | None = None, *, stats: bool = True
                       ) -> dict[str, Tensor]:
        """One gradient update on a batch whose TD targets were computed already.

        ``stats=False`` lets the hand-derived path skip the loss statistics (an
        optimisation step reports its last update's only)."""
        if self.backprop is not None:
            loss_stats, self.td_errors = self.backprop(obs, action, target, weights, stats)
            # finite unless a TD error is not (or their sum overflows, beyond 1e36 each)
            self.step.apply(self.td_errors.sum())
        elif (whole := self.whole_update(self.module().online, self.td_loss)) is not None:
            loss_stats, self.td_errors = whole(obs, action, target, weights)
        else:
            loss_stats, self.td_errors = self.compiled(self._loss_step)(obs, action, target,
                                                                         weights)
        self.after_update()
        return loss_stats

    def _loss_step(self, obs: Tensor, action: Tensor, target: Tensor, weights: Tensor | None
                   ) -> tuple[dict[str, Tensor], Tensor]:
        loss, stats_and_td_errors = self.td_loss(self.module().online, obs, action, target,
                                                 weights)
        self.step(loss)
        return stats_and_td_errors

    @staticmethod
    def td_loss(online: nn.Module, obs: Tensor, action: Tensor, target: Tensor,
                weights: Tensor | None) -> tuple[Tensor, tuple[dict[str, Tensor], Tensor]]:
        """The loss of a batch whose targets were computed already, as
        :class:`~rlloop.learners.whole_update.WholeUpdate` takes it (QR-DQN's differs)."""
        return _loss(online, obs, action, target, weights)

    def target_update_every(self) -> int:
        return int(self.config.target_update_interval)

    def update_targets(self, module_id: str) -> None:
        """Copy the online network (``tau = 1``) or average towards it (``tau < 1``)."""
        m = self.module(module_id)
        if self.config.tau >= 1.0:
            hard_update(m.target, m.online)
        else:
            polyak_update(m.target, m.online, self.config.tau)


def manual_backward(config: DQNConfig, online: nn.Module) -> bool:
    """Whether the update takes the hand-derived backward pass: asked for, or ``auto`` on a
    CPU, eager, with a network the pass derives (quietly autograd otherwise)."""
    if config.manual_backward != "auto":
        return bool(config.manual_backward)
    device = next(online.parameters()).device
    return device.type == "cpu" and not config.compile and plain_relu_q_network(online)


def _loss(online: nn.Module, obs: Tensor, action: Tensor, target: Tensor,
          weights: Tensor | None) -> tuple[Tensor, tuple[dict[str, Tensor], Tensor]]:
    """DQN's loss as :class:`~rlloop.learners.whole_update.WholeUpdate` takes it."""
    loss, stats, td_errors = dqn_loss(online(obs), action, target, weights)
    return loss, (stats, td_errors)


class DQN(OffPolicyAlgorithmBase):
    """Epsilon-greedy acting on the off-policy cadence; one optimisation step makes
    ``gradient_steps`` DQN updates."""

    name = "dqn"
    config: DQNConfig
    learner: DQNLearner
    #: The learner class (QR-DQN subclasses both and keeps the rest).
    learner_cls: type[DQNLearner] = DQNLearner

    def __init__(self, config: DQNConfig, env: EnvSettings) -> None:
        if not isinstance(env.spec.action_space, Discrete):
            raise ConfigError(f"{self.name} needs discrete actions but {env.env_id} has "
                              "continuous ones; use sac or td3")
        self.mask_dims = resolve_action_mask(config.action_mask, env.spec, self.name)
        if self.mask_dims and config.normalize_obs:  # standardising would blur the 0/1 mask
            raise ConfigError(f"{self.name}.normalize_obs cannot run with an action mask "
                              f"from {env.env_id}; set {self.name}.normalize_obs=false")
        super().__init__(self.name, env, config)
        self.config = config
        self.space = env.spec.action_space
        self.q = build_module(lambda: self.network(env), self.device)
        self.learner = self.learner_cls({DEFAULT_MODULE_ID: DQNModule(self.q)}, config,
                                        env.on_nonfinite)
        self.loop = OffPolicyLoop(self.runner, config, self.space, self.generator,
                                  random_actions=self._random if self.mask_dims else None,
                                  obs_stats=self.obs_stats)
        self.epsilon = Linear(config.exploration_initial_eps, config.exploration_final_eps,
                              config.exploration_steps)

    def network(self, env: EnvSettings) -> nn.Module:
        """The online network: Q-values ``[B, n_actions]`` when called (masked)."""
        spec, config = env.spec, self.config
        return QNetwork(flat_dim(spec.obs_shape), self.space.n, config.hidden, config.dueling,
                        self.encoder(env), mask_dims=self.mask_dims)

    def encoder(self, env: EnvSettings) -> Encoder | None:
        """The observation encoder the config asks for (None: the MLP on flat input)."""
        spec, config = env.spec, self.config
        return build_encoder(self.name, config.network_encoder, spec.obs_shape, spec.image_obs,
                             spec.obs_parts, config.hidden, cnn_precision=config.cnn_precision,
                             standardized=config.normalize_obs)

    # ---- acting ----------------------------------------------------------------------
    def _epsilon_greedy(self, obs: Tensor, eps: float, generator: torch.Generator) -> Tensor:
        greedy = self.q(obs).argmax(1)
        n = obs.shape[0]
        explore = torch.rand(n, generator=generator, device=generator.device) < eps
        return torch.where(explore, self._random(obs, generator), greedy)

    def _random(self, obs: Tensor, generator: torch.Generator) -> Tensor:
        """Uniformly random actions for ``obs``: among the legal ones when masking."""
        if self.mask_dims:
            return random_legal_actions(legal_actions(obs.flatten(1), self.mask_dims),
                                        generator)
        return sample_random_actions(self.space, obs.shape[0], generator)

    def _explore(self, obs: Tensor) -> Tensor:
        return self._epsilon_greedy(obs, self.epsilon(self.loop.env_steps), self.generator)

    @torch.no_grad()
    def act(self, obs: Tensor, deterministic: bool = True) -> Tensor:
        """Greedy actions, or epsilon-greedy with the final epsilon (an eval-only RNG)."""
        if deterministic:
            return self.q(obs).argmax(1)
        return self._epsilon_greedy(obs, self.config.exploration_final_eps,
                                    self._eval_generator)

    # ---- the off-policy cadence (the rest is OffPolicyAlgorithmBase's) ----------------
    def _optimize(self, env_steps: int) -> Mapping[str, Tensor] | None:
        if isinstance(self.loop.replay, PrioritizedReplayBuffer):
            return self.loop.optimize(env_steps, self._update)
        return self._optimize_uniform()

    def _extra_stats(self, env_steps: int) -> dict[str, float]:
        return {"dqn/epsilon": self.epsilon(env_steps)}

    def _optimize_uniform(self) -> dict[str, Tensor]:
        """``gradient_steps`` updates; while the target network stays fixed (hard updates
        every k >= gradient_steps updates, rl-zoo's setting) the batches are drawn at once
        and their TD targets come from one large target-network pass. Identical maths and
        sampling distribution, a fraction of the small-op overhead."""
        cfg, learner, loop = self.config, self.learner, self.loop
        stats: dict[str, Tensor] = {}
        left = cfg.gradient_steps
        while left:
            k = learner.updates_with_fixed_target(left)
            if k <= 1:
                batch = loop.sample(cfg.batch_size, loop.env_steps)
                stats = learner.update(batch.for_update())
                left -= 1
                continue
            batch = loop.sample(k * cfg.batch_size, loop.env_steps)
            stats = learner.updates_towards(batch.obs, batch.action, learner.targets(batch), k,
                                            stats=k == left)
            left -= k
        return stats

    def _update(self, batch: Transitions, rows: Tensor | None) -> dict[str, Tensor]:
        stats = self.learner.update(batch)
        replay = self.loop.replay
        if isinstance(replay, PrioritizedReplayBuffer) and rows is not None:
            assert self.learner.td_errors is not None
            replay.update_priorities(rows, self.learner.td_errors)
        return stats
