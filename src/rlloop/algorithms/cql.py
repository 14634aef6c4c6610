"""Conservative Q-learning (Kumar et al. 2020, arXiv:2006.04779), for continuous actions and,
with a Q-network, discrete ones (the paper's CQL(H) on DQN, as TorchRL's
``DiscreteCQLLoss``).

SAC's actor, twin critics with Polyak targets and learned temperature, trained on a
dataset: the critics' TD loss (each critic's squared error, summed) gets CQL(H)'s penalty
(:func:`~rlloop.losses.offline.cql_penalty`), which lowers Q on actions drawn uniformly
and from the policy and raises it on the dataset's, so that the policy cannot exploit
overestimated actions the data never shows. As in the authors' code, the policy's actions
at the next state are scored at the current one, the sampled actions and their
log-densities carry no gradient, and the penalty's actions are drawn anew per update.

One backward pass over the critic, penalty, actor and alpha losses: the actor reads the
critics with detached weights and alpha and actor detach each other's inputs, as in
:mod:`rlloop.algorithms.sac`.
"""

from __future__ import annotations

import copy
import math
from typing import cast

import torch
from torch import Tensor, nn

from rlloop.algorithms.base import EnvSettings
from rlloop.algorithms.offline_base import OfflineAlgorithmBase, OfflineLearnerBase
from rlloop.algorithms.sac import add_actor_critic_adams
from rlloop.config.offline import CQLConfig as CQLConfig
from rlloop.data.transitions import Transitions
from rlloop.envs.core import Box, Discrete
from rlloop.learners.learner import DEFAULT_MODULE_ID
from rlloop.losses.dqn import dqn_target
from rlloop.losses.offline import cql_discrete_loss, cql_penalty, td_loss
from rlloop.losses.sac import sac_actor_loss, sac_alpha_loss, sac_target
from rlloop.modules.networks import flat_dim
from rlloop.modules.q_networks import QNetwork, TanhGaussianActor, TwinQ
from rlloop.system.devices import build_module


class CQLModule(nn.Module):
    """SAC's networks: actor, twin critics, their Polyak target and ``log alpha``."""

    def __init__(self, obs_dim: int, act_dim: int, config: CQLConfig) -> None:
        super().__init__()
        self.actor = TanhGaussianActor(obs_dim, act_dim, config.hidden)
        self.critic = TwinQ(obs_dim, act_dim, config.hidden)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.log_alpha = nn.Parameter(torch.tensor(math.log(config.init_alpha)),
                                      requires_grad=config.autotune_alpha)


class CQLLearner(OfflineLearnerBase):
    """``actor``, ``critic`` and ``alpha`` optimisers; one backward per update."""

    config: CQLConfig

    def __init__(self, modules: dict[str, CQLModule], config: CQLConfig, act_dim: int,
                 generator: torch.Generator, on_nonfinite: str = "skip") -> None:
        self.act_dim, self.generator = act_dim, generator
        super().__init__(modules, config, on_nonfinite=on_nonfinite)

    def module(self, module_id: str = DEFAULT_MODULE_ID) -> CQLModule:
        return cast(CQLModule, self.modules[module_id])

    def configure_optimizers_for_module(self, module_id: str, config: CQLConfig) -> None:
        add_actor_critic_adams(self, module_id, self.module(module_id), config.lr,
                               config.autotune_alpha)

    def noise(self, batch: Transitions) -> dict[str, Tensor]:
        """The update's random draws, in this order: the policy's standard normal noise at
        the next states ``[B, d]``, the penalty's uniform actions ``[B N, d]`` and its
        policy noise at the states and the next states ``[B N, d]`` each, the actor
        loss's noise ``[B, d]``."""
        b, n, g = len(batch), self.config.cql_actions, self.generator

        def normal(rows: int) -> Tensor:
            return torch.randn((rows, self.act_dim), generator=g, device=g.device,
                               dtype=batch.reward.dtype)

        next_noise = normal(b)
        uniform = torch.rand((b * n, self.act_dim), generator=g, device=g.device,
                             dtype=batch.reward.dtype)
        return {"next": next_noise, "random": uniform * 2 - 1, "pi": normal(b * n),
                "next_pi": normal(b * n), "actor": normal(b)}

    def compute_loss_for_module(self, module_id: str, config: CQLConfig, batch: Transitions,
                                fwd_out: object = None) -> tuple[Tensor, dict[str, Tensor]]:
        return self.loss(self.module(module_id), batch, self.noise(batch))

    def loss(self, m: CQLModule, batch: Transitions, noise: dict[str, Tensor]
             ) -> tuple[Tensor, dict[str, Tensor]]:
        """TD + penalty + actor (+ alpha) loss for ``noise`` (:meth:`noise`'s draws)."""
        cfg, n = self.config, self.config.cql_actions
        alpha = m.log_alpha.detach().exp()
        with torch.no_grad():
            next_action, next_log_prob = m.actor(batch.next_obs, noise=noise["next"])
            next_q = m.critic_target(batch.next_obs, next_action)
            target = sac_target(batch.reward, batch.discount, batch.terminated, next_q[0],
                                next_q[1], next_log_prob,
                                0.0 if cfg.deterministic_backup else alpha)
            obs_n = batch.obs.repeat_interleave(n, 0)
            pi, log_pi = m.actor(obs_n, noise=noise["pi"])
            next_pi, next_log_pi = m.actor(batch.next_obs.repeat_interleave(n, 0),
                                           noise=noise["next_pi"])
        q = m.critic(batch.obs, batch.action)
        loss, stats = td_loss(q, target)
        shape = (q.shape[0], len(batch), n)
        penalty, penalty_stats = cql_penalty(
            q, m.critic(obs_n, noise["random"]).view(shape), m.critic(obs_n, pi).view(shape),
            log_pi.view(-1, n), m.critic(obs_n, next_pi).view(shape),
            next_log_pi.view(-1, n), self.act_dim, cfg.penalty_weight(discrete=False),
            cfg.cql_temperature)
        action, log_prob = m.actor(batch.obs, noise=noise["actor"])
        q_pi = m.critic(batch.obs, action, detach_params=True)
        actor_loss, actor_stats = sac_actor_loss(q_pi[0], q_pi[1], log_prob, alpha)
        loss = loss + penalty + actor_loss
        stats.update(penalty_stats)
        stats.update(actor_stats)
        if cfg.autotune_alpha:
            alpha_loss, alpha_stats = sac_alpha_loss(m.log_alpha, log_prob, -float(self.act_dim))
            loss = loss + alpha_loss
            stats.update(alpha_stats)
        return loss, stats



class DiscreteCQLModule(nn.Module):
    """Discrete CQL's Q-network ``[B, *obs] -> [B, n]`` and its Polyak target."""

    def __init__(self, obs_dim: int, n_actions: int, config: CQLConfig) -> None:
        super().__init__()
        self.critic = QNetwork(obs_dim, n_actions, config.hidden)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)


class DiscreteCQLLearner(OfflineLearnerBase):
    """One ``critic`` optimiser: DQN's TD loss (squared) with CQL(H)'s penalty
    (:func:`~rlloop.losses.offline.cql_discrete_loss`)."""

    config: CQLConfig

    def configure_optimizers_for_module(self, module_id: str, config: CQLConfig) -> None:
        m = cast(DiscreteCQLModule, self.modules[module_id])
        self.add_adam(module_id, "critic", list(m.critic.parameters()), config.lr)

    def compute_loss_for_module(self, module_id: str, config: CQLConfig, batch: Transitions,
                                fwd_out: object = None) -> tuple[Tensor, dict[str, Tensor]]:
        m = cast(DiscreteCQLModule, self.modules[module_id])
        with torch.no_grad():
            target = dqn_target(batch.reward, batch.discount, batch.terminated,
                                m.critic_target(batch.next_obs))
        return cql_discrete_loss(m.critic(batch.obs), batch.action, target,
                                 config.penalty_weight(discrete=True))


class CQL(OfflineAlgorithmBase):
    """CQL on the offline cadence: SAC's networks for continuous actions (in ``[-1, 1]``,
    rescaled for the env), a Q-network acting greedily for discrete ones."""

    name = "cql"
    takes_discrete = True
    config: CQLConfig
    learner: CQLLearner | DiscreteCQLLearner
    module: CQLModule | DiscreteCQLModule

    def __init__(self, config: CQLConfig, env: EnvSettings) -> None:
        super().__init__(config, env)
        space = env.spec.action_space
        obs_dim = flat_dim(env.spec.obs_shape)
        if isinstance(space, Discrete):
            self.module = build_module(lambda: DiscreteCQLModule(obs_dim, space.n, config),
                                       self.device)
            self.learner = DiscreteCQLLearner({DEFAULT_MODULE_ID: self.module}, config,
                                              on_nonfinite=env.on_nonfinite)
            return
        box = cast(Box, space)
        self.module = build_module(lambda: CQLModule(obs_dim, box.dim, config), self.device)
        self.learner = CQLLearner({DEFAULT_MODULE_ID: self.module}, config, box.dim,
                                  self.generator, env.on_nonfinite)

    def act_unit(self, obs: Tensor, deterministic: bool) -> Tensor:
        """Discrete actions: the greedy ones (a stochastic evaluation too); else the actor's."""
        if isinstance(self.module, DiscreteCQLModule):
            return self.module.critic(obs).argmax(-1)
        return super().act_unit(obs, deterministic)
