"""APPO and IMPALA: asynchronous actor-learner training with V-trace (Espeholt et al., 2018).

Env runners in processes of their own (:mod:`rlloop.runners.async_runners`) keep sampling
fragments with the weights they have while the learner learns; each fragment carries the
version of the weights that sampled it, and one too stale is dropped. The learner takes
``fragments_per_batch`` fragments, evaluates them with its current weights (the target
policy pi and V), and corrects for the lag with :func:`rlloop.losses.vtrace.vtrace`:

- **APPO** runs :func:`rlloop.losses.appo.appo_loss` (PPO's clipped surrogate, ``num_epochs``
  of minibatches) on V-trace's advantages, its ratio taken against the behaviour policy's
  log-probabilities, and regresses V onto V-trace's targets.
- **IMPALA** takes one gradient step of :func:`rlloop.losses.a2c.a2c_loss` (the policy
  gradient, value and entropy terms) on V-trace's advantages and targets, with RMSprop.

A runner builds the same class for its own envs and samples with PPO's collection
(:class:`~rlloop.runners.fragments.FragmentSampler`); only the learner's instance has
runners attached.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from rlloop.algorithms.a2c import A2CLearner
from rlloop.algorithms.ppo import PPO, PPOLearner
from rlloop.config.appo import APPOConfig as APPOConfig
from rlloop.config.appo import IMPALAConfig as IMPALAConfig
from rlloop.data.rollout import RolloutBatch
from rlloop.errors import ConfigError
from rlloop.learners.learner import DEFAULT_MODULE_ID, Learner
from rlloop.losses.appo import appo_loss
from rlloop.losses.vtrace import vtrace
from rlloop.runners.fragments import Fragment


def _joined(frags: list[Fragment], name: str) -> Tensor:
    """One field of every fragment side by side: ``[T, sum of M, ...]`` (or ``[sum of M,
    ...]`` for ``last_obs``)."""
    return torch.cat([getattr(f, name) for f in frags], dim=0 if name == "last_obs" else 1)


class APPOLearner(PPOLearner):
    """PPO's learner with :func:`~rlloop.losses.appo.appo_loss`: a batch's ``log_probs``
    are the behaviour policy's, its advantages and returns V-trace's."""

    loss_fn = staticmethod(appo_loss)


class APPO(PPO):
    """Take ``fragments_per_batch`` fragments from the runners, then ``num_epochs`` of
    minibatch PPO on their V-trace advantages (see the module doc)."""

    name = "appo"
    learner_cls: ClassVar[type[Learner[RolloutBatch]]] = APPOLearner
    config: Any  # APPOConfig here, IMPALAConfig in IMPALA

    transient_attrs: ClassVar[frozenset[str]] = PPO.transient_attrs | {"_fragments"}

    def __init__(self, config: APPOConfig, env: Any) -> None:
        super().__init__(config, env)
        self._fragments: list[Fragment] = []

    def collect(self) -> dict[str, float]:
        take = getattr(self.runner, "take", None)
        if take is None:
            raise ConfigError(f"{self.name} learns from env runners; build it with "
                              "num_env_runners=1 or more")
        self._fragments = take(self.config.fragments_per_batch)
        steps = sum(f.steps for f in self._fragments)
        return {"env/steps": float(steps), **self.runner.episodes.stats()}

    def update(self, env_steps: int) -> dict[str, float]:
        self.learner.before_gradient_based_update(env_steps)
        batch = self._batch()
        cfg = self.config

        def kl_stop(stats: dict[str, Tensor]) -> bool:
            return cfg.target_kl is not None and float(stats["ppo/approx_kl"]) > cfg.target_kl

        return self.learner.update_from_batch(
            {DEFAULT_MODULE_ID: batch}, num_epochs=cfg.num_epochs,
            minibatch_size=min(cfg.minibatch_size, len(batch.advantages)),
            generator=self.generator, stop=kl_stop)

    @torch.no_grad()
    def _batch(self) -> RolloutBatch:
        """The fragments as one batch, with V-trace's advantages and targets under the
        current weights."""
        frags, cfg = self._fragments, self.config
        obs = _joined(frags, "obs")
        t, n = obs.shape[:2]
        actions = _joined(frags, "actions")
        behaviour = _joined(frags, "log_probs")
        rewards = _joined(frags, "rewards")
        terminated, truncated = _joined(frags, "terminated"), _joined(frags, "truncated")
        flat_obs = obs.flatten(0, 1)
        flat_actions = actions.flatten(0, 1)
        dist, values = self.policy.dist_value(flat_obs)
        target = dist.log_prob(flat_actions.flatten(1) if flat_actions.dim() > 1
                               else flat_actions).view(t, n)
        values = values.view(t, n)
        last_values = self.policy.value(_joined(frags, "last_obs"))
        next_values = torch.cat([values[1:], last_values.unsqueeze(0)])
        if bool(truncated.any()):  # time limits bootstrap from the final observation
            final = _joined(frags, "next_obs")
            next_values[truncated] = self.policy.value(final[truncated])
        if cfg.clip_rewards:
            rewards = rewards.sign()
        out = vtrace(target, behaviour, rewards, values, next_values, terminated, truncated,
                     cfg.gamma, cfg.vtrace_rho_bar, cfg.vtrace_c_bar)
        return RolloutBatch(flat_obs, flat_actions, behaviour.flatten(),
                            out.advantages.flatten(), out.targets.flatten(), values.flatten())


class IMPALA(APPO):
    """Take ``fragments_per_batch`` fragments, then one IMPALA gradient step on them."""

    name = "impala"
    learner_cls: ClassVar[type[Learner[RolloutBatch]]] = A2CLearner

    def update(self, env_steps: int) -> dict[str, float]:
        self.learner.before_gradient_based_update(env_steps)
        return self.learner.update_from_batch(
            {DEFAULT_MODULE_ID: self._batch()}, shuffle_batch_per_epoch=False)
