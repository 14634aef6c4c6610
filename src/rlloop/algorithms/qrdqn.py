"""QR-DQN (Dabney et al. 2018, "Distributional Reinforcement Learning with Quantile
Regression", AAAI): DQN whose network predicts ``n_quantiles`` quantiles of each action's
return instead of its mean, trained with the quantile Huber loss.

Everything else is DQN's (:mod:`rlloop.algorithms.dqn`): epsilon-greedy acting on the
quantiles' mean, the target network and its cadence, the replay variants (uniform,
prioritized, n-step, frames), invalid-action masks and the batched-target fast path. The
loss is :func:`rlloop.losses.quantile.qrdqn_loss`, the target
:func:`rlloop.losses.quantile.qrdqn_target`.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import Tensor, nn

from rlloop.algorithms.base import EnvSettings
from rlloop.algorithms.dqn import DQN, DQNLearner, DQNModule
from rlloop.config.quantile import QRDQNConfig as QRDQNConfig
from rlloop.data.transitions import Transitions
from rlloop.losses.quantile import qrdqn_loss, qrdqn_target
from rlloop.modules.networks import flat_dim
from rlloop.modules.q_networks import QuantileQNetwork


class QRDQNLearner(DQNLearner):
    """DQN's learner with quantile targets ``[B, N]`` and the quantile Huber loss."""

    def compute_loss_for_module(self, module_id: str, config: Any, batch: Transitions,
                                fwd_out: Any = None) -> tuple[Tensor, dict[str, Tensor]]:
        m = self.module(module_id)
        loss, stats, self.td_errors = qrdqn_loss(_online(m).quantiles(batch.obs),
                                                 batch.action, self._td_target(m, batch),
                                                 batch.weights)
        return loss, stats

    def _td_target(self, m: DQNModule, batch: Transitions) -> Tensor:
        with torch.no_grad():
            return self._target_of(m, batch.reward, batch.discount, batch.terminated,
                                   batch.next_obs)

    def _target_of(self, m: DQNModule, reward: Tensor, discount: Tensor,
                   terminated: Tensor, next_obs: Tensor) -> Tensor:
        next_z, next_q = cast(QuantileQNetwork, m.target).quantiles_and_q(next_obs)
        if self.config.double_q:
            next_q = m.online(next_obs)
        return qrdqn_target(reward, discount, terminated, next_z, next_q)

    @torch.no_grad()
    def targets(self, batch: Transitions, chunk: int = 1024) -> Tensor:
        """Target quantiles ``[B, N]``, ``chunk`` rows per target-network pass."""
        m, rows = self.module(), batch.next_obs.shape[0]
        return torch.cat([
            self._target_of(m, batch.reward[i:i + chunk], batch.discount[i:i + chunk],
                            batch.terminated[i:i + chunk], batch.next_obs[i:i + chunk])
            for i in range(0, rows, chunk)])

    @staticmethod
    def td_loss(online: nn.Module, obs: Tensor, action: Tensor, target: Tensor,
                weights: Tensor | None) -> tuple[Tensor, tuple[dict[str, Tensor], Tensor]]:
        loss, stats, td_errors = qrdqn_loss(cast(QuantileQNetwork, online).quantiles(obs),
                                            action, target, weights)
        return loss, (stats, td_errors)


def _online(m: DQNModule) -> QuantileQNetwork:
    return cast(QuantileQNetwork, m.online)


class QRDQN(DQN):
    """DQN's acting and cadence on a quantile network; one optimisation step makes
    ``gradient_steps`` QR-DQN updates."""

    name = "qrdqn"
    config: QRDQNConfig
    learner_cls = QRDQNLearner

    def network(self, env: EnvSettings) -> nn.Module:
        spec, config = env.spec, self.config
        return QuantileQNetwork(flat_dim(spec.obs_shape), self.space.n, config.n_quantiles,
                                config.hidden, self.encoder(env), mask_dims=self.mask_dims)
