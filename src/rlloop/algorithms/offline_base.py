"""What the offline algorithms (BC, CQL, IQL) share: a dataset in place of env steps.

An offline algorithm checks its dataset's spaces against the env's when it is built, loads
the whole dataset onto the run's device when training first needs it
(:func:`~rlloop.data.offline_dataset.load_dataset`; a policy loaded only to act reads
none) and samples every gradient update's batch from it. It runs on
:class:`~rlloop.trainers.offline_schedule.OfflineSchedule`: the off-policy cadence with
one gradient update per iteration and no env step, so ``env/steps`` stays 0 and
``algorithm/steps`` counts gradient updates (evaluations, records, checkpoints and the
``total_gradient_steps`` budget with it). The env is made to evaluate in, with one training env
that is never stepped.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, cast

import torch
from torch import Tensor, nn

from rlloop.algorithms.base import EVAL_SEED_OFFSET, AlgorithmBase, EnvSettings
from rlloop.algorithms.offpolicy_base import OffPolicyLearnerBase
from rlloop.algorithms.offpolicy_loop import box_rescaler
from rlloop.config.offline import OfflineConfig, check_dataset_given, dataset_dir
from rlloop.data.offline_dataset import OfflineDataset, check_dataset, load_dataset
from rlloop.data.transitions import Transitions
from rlloop.envs.core import Box
from rlloop.errors import ConfigError, SavedStateError, saved_count
from rlloop.learners.learner import DEFAULT_MODULE_ID
from rlloop.losses.polyak import polyak_update
from rlloop.system.devices import new_generator, set_generator_state
from rlloop.system.seeding import derive_seed


class OfflineLearnerBase(OffPolicyLearnerBase):
    """One backward pass over :meth:`compute_loss_for_module`'s loss per update, then the
    Polyak update of the module's ``critic_target`` (where it has one) by ``tau``."""

    def update(self, batch: Transitions) -> dict[str, Tensor]:
        loss, stats = self.compute_loss_for_module(DEFAULT_MODULE_ID, self.config, batch)
        self.step(loss)
        self.after_update()
        return stats

    def target_update_every(self) -> int:
        return 1

    def update_targets(self, module_id: str) -> None:
        module: Any = self.modules[module_id]
        if hasattr(module, "critic_target"):
            polyak_update(module.critic_target, module.critic, self.config.tau)


class OfflineAlgorithmBase(AlgorithmBase):
    """The dataset, the gradient update that samples it, acting and the state.

    Subclasses build ``learner`` (an :class:`OffPolicyLearnerBase`: one guarded backward
    per update, target updates, skipped-update counts) in ``__init__`` and implement
    :meth:`act_unit`.
    """

    config: OfflineConfig
    learner: OffPolicyLearnerBase
    #: The learner's module (the policy: ``actor``, or BC's ``policy``).
    module: nn.Module
    standardize_train_env = False
    #: Whether the algorithm takes Discrete actions (BC); the others take Box ones only.
    takes_discrete: bool = False

    def __init__(self, config: OfflineConfig, env: EnvSettings) -> None:
        if not (self.takes_discrete or isinstance(env.spec.action_space, Box)):
            raise ConfigError(f"{self.name} needs continuous (Box) actions but {env.env_id} "
                              "has discrete ones; use bc")
        check_dataset_given(self.name, config.dataset)
        # One training env: the runner's, never stepped (the dataset replaces it).
        super().__init__(dataclasses.replace(env, num_envs=1))
        self.config = config
        if dataset_dir(config.dataset).exists():  # else refused when training needs it
            check_dataset(config.dataset, env.spec)
        self._dataset: OfflineDataset | None = None
        space = env.spec.action_space
        #: One action's shape (``()`` for Discrete ones).
        self.action_shape: tuple[int, ...] = space.shape if isinstance(space, Box) else ()
        #: Continuous actions: the map from the policy's ``[-1, 1]`` to the env's box.
        self.to_env: Callable[[Tensor], Tensor] | None = (
            box_rescaler(self.name, space, self.device) if isinstance(space, Box) else None)
        #: Stochastic evaluation's own RNG: evaluating never shifts training's draws.
        self._eval_generator = new_generator(self.device, env.seed + EVAL_SEED_OFFSET)

    @property
    def dataset(self) -> OfflineDataset:
        """The whole dataset on the device, read when training first needs it: a policy
        loaded to act (``rlloop eval``, ``export``, ``load``) reads none."""
        if self._dataset is None:
            self._dataset = load_dataset(self.config.dataset, self.settings.spec, self.device)
        return self._dataset

    # ---- the offline cadence ---------------------------------------------------------
    def optimize(self, env_steps: int) -> dict[str, Tensor | float]:
        """One gradient update on a batch sampled from the dataset."""
        self.learner.before_gradient_based_update(env_steps)
        batch = self.dataset.sample(self.config.batch_size, self.generator, self.config.gamma)
        stats: dict[str, Tensor | float] = dict(self.learner.update(batch))
        self.learner.after_gradient_based_update()
        stats["guard/skipped_updates"] = self.learner.skip_count()
        return stats

    def episode_stats(self) -> dict[str, float]:
        return {}

    # ---- acting ----------------------------------------------------------------------
    def act_unit(self, obs: Tensor, deterministic: bool) -> Tensor:
        """The policy's actions for ``obs``: int64 ``[N]``, or ``[N, *act]`` in
        ``[-1, 1]`` (sampled ones from the eval-only RNG). By default those of the
        module's ``actor``: its ``mode``, or a ``sample``."""
        actor: Any = self.module.actor
        action = actor.mode(obs) if deterministic else actor.sample(obs, self._eval_generator)
        return cast(Tensor, action).view(-1, *self.action_shape)

    @torch.no_grad()
    def act(self, obs: Tensor, deterministic: bool = True) -> Tensor:
        action = self.act_unit(obs, deterministic)
        return action if self.to_env is None else self.to_env(action)

    # ---- state -----------------------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        return {**super().get_state(), "learner": self.learner.get_state(),
                "updates": self.learner.updates, "dataset": self.dataset.fingerprint(),
                "eval_generator": self._eval_generator.get_state()}

    def set_state(self, state: dict[str, Any]) -> None:
        saved = state.get("dataset")
        if saved is not None and {k: float(v) for k, v in saved.items()} != (
                self.dataset.fingerprint()):
            raise SavedStateError(f"the checkpoint was trained on another dataset than "
                                  f"{self.config.dataset} holds now ({saved}); resume with "
                                  "the dataset it was trained on")
        super().set_state(state)
        self.learner.set_state(state["learner"])
        self.learner.updates = saved_count(state["updates"], "algorithm.updates")
        set_generator_state(self._eval_generator, state["eval_generator"],
                            derive_seed(self.settings.seed, "evaluation-resumed"))
