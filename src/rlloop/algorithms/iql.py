"""Implicit Q-learning (Kostrikov et al. 2021, arXiv:2110.06169).

Three networks learn from the dataset's transitions alone, never querying an action the
data does not hold: ``V(s)``, the ``expectile`` of the target critics' ``min Q(s, a)``
over the dataset's actions (:func:`~rlloop.losses.offline.iql_value_loss`); twin critics
``Q(s, a)`` towards ``r + gamma V(s')`` (:func:`~rlloop.losses.offline.iql_critic_loss`),
with Polyak targets; and the policy, fitted to the dataset's actions weighted by
``exp(beta (Q - V))`` (:func:`~rlloop.losses.offline.iql_actor_loss`). The policy is a
Gaussian with a ``tanh`` mean (:class:`~rlloop.modules.offline_actors.TanhMeanGaussianActor`)
that acts by its mean.

One backward pass over the three losses: each reads the others' networks without gradient
(the target critics, ``V(s')`` and ``V(s)`` detached), so every optimiser gets its own
loss's gradient, all from the parameters before the update.
"""

from __future__ import annotations

import copy
from typing import cast

from torch import Tensor, nn

from rlloop.algorithms.base import EnvSettings
from rlloop.algorithms.offline_base import OfflineAlgorithmBase, OfflineLearnerBase
from rlloop.config.offline import IQLConfig as IQLConfig
from rlloop.data.transitions import Transitions
from rlloop.envs.core import Box
from rlloop.learners.learner import DEFAULT_MODULE_ID
from rlloop.losses.offline import iql_actor_loss, iql_critic_loss, iql_value_loss
from rlloop.modules.networks import flat_dim
from rlloop.modules.offline_actors import TanhMeanGaussianActor
from rlloop.modules.q_networks import MLP, TwinQ, encode
from rlloop.system.devices import build_module


class IQLModule(nn.Module):
    """The policy, twin critics with their Polyak target, and the value network."""

    def __init__(self, obs_dim: int, act_dim: int, config: IQLConfig) -> None:
        super().__init__()
        self.actor = TanhMeanGaussianActor(obs_dim, act_dim, config.hidden)
        self.critic = TwinQ(obs_dim, act_dim, config.hidden)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.value = MLP(obs_dim, config.hidden, 1)

    def v(self, obs: Tensor) -> Tensor:
        """``V(s)`` ``[B]``."""
        return self.value(encode(None, obs, self.value.dtype)).squeeze(-1)


class IQLLearner(OfflineLearnerBase):
    """``actor``, ``critic`` and ``value`` optimisers; one backward per update."""

    config: IQLConfig

    def module(self, module_id: str = DEFAULT_MODULE_ID) -> IQLModule:
        return cast(IQLModule, self.modules[module_id])

    def configure_optimizers_for_module(self, module_id: str, config: IQLConfig) -> None:
        m = self.module(module_id)
        for name, net in (("actor", m.actor), ("critic", m.critic), ("value", m.value)):
            self.add_adam(module_id, name, list(net.parameters()), config.lr)

    def compute_loss_for_module(self, module_id: str, config: IQLConfig, batch: Transitions,
                                fwd_out: object = None) -> tuple[Tensor, dict[str, Tensor]]:
        cfg, m = self.config, self.module(module_id)
        q_target = m.critic_target(batch.obs, batch.action)  # no gradient: a target
        value = m.v(batch.obs)
        loss, stats = iql_value_loss(q_target, value, cfg.expectile)
        critic_loss, critic_stats = iql_critic_loss(
            m.critic(batch.obs, batch.action), batch.reward, batch.discount,
            batch.terminated, m.v(batch.next_obs).detach())
        actor_loss, actor_stats = iql_actor_loss(
            m.actor.log_prob(batch.obs, batch.action), q_target, value, cfg.temperature,
            cfg.max_weight)
        stats.update(critic_stats)
        stats.update(actor_stats)
        return loss + critic_loss + actor_loss, stats



class IQL(OfflineAlgorithmBase):
    """IQL on the offline cadence; actions live in ``[-1, 1]`` and are rescaled for the env."""

    name = "iql"
    config: IQLConfig
    learner: IQLLearner
    module: IQLModule

    def __init__(self, config: IQLConfig, env: EnvSettings) -> None:
        super().__init__(config, env)
        space = cast(Box, env.spec.action_space)
        obs_dim = flat_dim(env.spec.obs_shape)
        self.module = build_module(lambda: IQLModule(obs_dim, space.dim, config), self.device)
        self.learner = IQLLearner({DEFAULT_MODULE_ID: self.module}, config,
                                  on_nonfinite=env.on_nonfinite)
