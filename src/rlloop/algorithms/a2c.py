"""A2C: PPO's collection, GAE and network with one plain policy-gradient step per rollout.

Everything but the update is :class:`~rlloop.algorithms.ppo.PPO`'s: the rollout of
``rollout_steps`` per env (native or Gymnasium envs, observation and reward treatments,
gSDE, action masks, a CNN shared by actor and critic for pixels), GAE with truncation
bootstrapped from the final observation, the checkpointed state; only, on a CPU, an MLP
critic values the rollout in one pass at the update instead of as it acts
(``values_while_acting``). The update is one gradient step of
:func:`rlloop.losses.a2c.a2c_loss` on the whole rollout, in its stored order (no epochs,
minibatches or shuffling), with RMSprop by default: Stable-Baselines3's ``A2C.train``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar, Literal

import torch
from torch import Tensor, nn

from rlloop.algorithms.ppo import PPO
from rlloop.config.a2c import A2CConfig as A2CConfig
from rlloop.config.gradient_clip import GradientClip
from rlloop.config.schedules import learning_rate
from rlloop.data.rollout import RolloutBatch
from rlloop.learners.adam import Adam
from rlloop.learners.foreach_rmsprop import ForeachRMSprop
from rlloop.learners.learner import DEFAULT_MODULE_ID, Learner
from rlloop.losses.a2c import a2c_loss
from rlloop.modules.actor_critic import ActorCritic
from rlloop.modules.distributions import ActionDist


class A2CLearner(Learner[RolloutBatch]):
    """RMSprop (or Adam) per module; the loss of :func:`rlloop.losses.a2c.a2c_loss`, with
    ``ent_coef`` scheduled on the env-step timeline."""

    def __init__(
        self,
        modules: Mapping[str, nn.Module],
        config: A2CConfig,
        on_nonfinite: Literal["skip", "raise"] = "skip",
    ) -> None:
        super().__init__(modules, config, on_nonfinite=on_nonfinite)

    def configure_optimizers_for_module(self, module_id: str, config: A2CConfig) -> None:
        params = list(self.modules[module_id].parameters())
        optimizer: torch.optim.Optimizer
        if config.optimizer == "rmsprop":
            # foreach: one kernel per operation over all tensors instead of one per tensor
            # (torch picks it on CUDA only); ~0.2 ms of a CartPole update on a CPU. On a
            # CPU the step calls those kernels without torch's Python around them.
            optimizer = ForeachRMSprop(
                params,
                lr=config.lr,
                alpha=config.rmsprop_alpha,
                eps=config.optimizer_eps,
                foreach=True,
            )
        else:
            optimizer = Adam(params, lr=config.lr, eps=config.optimizer_eps, fused=True)
        self.register_optimizer(
            module_id,
            "default",
            optimizer,
            params,
            learning_rate(config.lr, config.lr_schedule, config.lr_decay_steps),
            GradientClip(config.max_grad_norm, config.grad_clip_by),
        )
        self.register_hyperparameter(module_id, "ent_coef", config.ent_coef)

    def forward_train(self, module_id: str, batch: RolloutBatch) -> tuple[ActionDist, Tensor]:
        module = self.modules[module_id]
        assert isinstance(module, ActorCritic)
        return module.dist_value(batch.obs)

    def compute_loss_for_module(
        self,
        module_id: str,
        config: A2CConfig,
        batch: RolloutBatch,
        fwd_out: tuple[ActionDist, Tensor] | None = None,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        dist, values = fwd_out or self.forward_train(module_id, batch)
        actions = batch.actions.flatten(1) if batch.actions.dim() > 1 else batch.actions
        return a2c_loss(
            dist.log_prob(actions),
            batch.advantages,
            values,
            batch.returns,
            dist.entropy(),
            config.vf_coef,
            self.hyperparameter(module_id, "ent_coef"),
            config.normalize_advantages,
        )


class A2C(PPO):
    """Collect ``rollout_steps`` x ``num_envs`` steps, then one A2C gradient step on them.

    Built from an :class:`~rlloop.config.a2c.A2CConfig`, whose fields are the ones
    :class:`PPO`'s collection reads (:class:`~rlloop.config.on_policy.OnPolicyConfig`'s)."""

    name = "a2c"
    learner_cls: ClassVar[type[Learner[RolloutBatch]]] = A2CLearner
    #: An A2C rollout is a few dozen rows (rl-zoo's CartPole: 5 steps of 8 envs): one
    #: critic pass over all of them at the update costs far less than a pass per env step,
    #: ~110 µs less of a 2 ms CartPole iteration. (A shared CNN still records them.)
    values_while_acting: ClassVar[bool] = False

    def update(self, env_steps: int) -> dict[str, float]:
        self.learner.before_gradient_based_update(env_steps)  # logs learner/lr_default etc.
        return self.learner.update_from_batch(
            {DEFAULT_MODULE_ID: self._batch()}, shuffle_batch_per_epoch=False
        )
