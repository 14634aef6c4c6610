"""The algorithm side of the off-policy cadence, shared by DQN, SAC and TD3.

:class:`OffPolicyAlgorithmBase` turns a learner, an :class:`OffPolicyLoop` and a
behaviour policy (``_explore``) into what
:class:`~rlloop.trainers.offpolicy_schedule.OffPolicySchedule` drives (``env_step``,
``optimize``, ``episode_stats``) and what the on-policy schedule drives (``collect``,
``update``), with the state
every off-policy algorithm checkpoints. Subclasses build ``config``, ``learner`` and
``loop`` in ``__init__`` and implement ``_explore`` and ``act``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from rlloop.algorithms.base import EVAL_SEED_OFFSET, AlgorithmBase, EnvSettings
from rlloop.algorithms.offpolicy_loop import OffPolicyLoop, box_rescaler, check_env_settings
from rlloop.algorithms.offpolicy_parts import Stats
from rlloop.config.gradient_clip import GradientClip
from rlloop.config.offpolicy import OffPolicyConfig
from rlloop.config.schedules import learning_rate
from rlloop.data.transitions import Transitions
from rlloop.envs.core import Box
from rlloop.envs.normalizer import RunningMeanStd
from rlloop.errors import ConfigError, saved_count
from rlloop.learners.adam import Adam
from rlloop.learners.flat_buffers import FlatParameters
from rlloop.learners.learner import Learner
from rlloop.learners.optim_step import GuardedOptim, GuardedStep, adam
from rlloop.learners.whole_update import LossFn, WholeUpdate
from rlloop.system.devices import new_generator, resolve_device, set_generator_state
from rlloop.system.seeding import derive_seed


class OffPolicyLearnerBase(Learner[Transitions]):
    """What DQN's, SAC's and TD3's learners share: ``Adam(fused=True)`` optimisers stepped
    by one :class:`~rlloop.learners.optim_step.GuardedStep` (one backward pass over the
    summed losses; a non-finite update is skipped on the device, without a host sync),
    the count of gradient updates, target-network updates every
    :meth:`target_update_every` of them, and ``compile``.

    A subclass implements ``compute_loss_for_module``, ``configure_optimizers_for_module``
    (calling :meth:`add_adam`), :meth:`target_update_every` and :meth:`update_targets`, and
    routes its updates through :meth:`whole_update` where it applies, else through
    :meth:`compiled` functions that end in :attr:`step`.
    """

    def __init__(self, modules: Mapping[str, nn.Module], config: Any,
                 on_nonfinite: str = "skip") -> None:
        #: Gradient updates made, skipped ones included: the target and delay cadences
        #: count them (knowing which were skipped would take a host sync per update).
        self.updates = 0
        self.step = GuardedStep()
        self._compiled: dict[str, Callable[..., Any]] = {}
        self._whole: WholeUpdate | None = None
        self._whole_supported: bool | None = None  # decided on first use
        super().__init__(modules, config, on_nonfinite=on_nonfinite)  # type: ignore[arg-type]

    @property
    def skipped_updates(self) -> int:  # type: ignore[override]
        """Updates skipped for a non-finite loss or gradient (reads the device counter)."""
        return int(self.skip_count())

    @skipped_updates.setter
    def skipped_updates(self, value: int) -> None:
        if self.step.skipped is not None:
            self.step.skipped.fill_(value)

    @property
    def tried_updates(self) -> int:  # type: ignore[override]
        """Gradient updates tried, skipped ones included: :attr:`updates`."""
        return self.updates

    @tried_updates.setter
    def tried_updates(self, value: int) -> None:
        self.updates = value

    def skip_count(self) -> Tensor:
        """:attr:`skipped_updates` as a new tensor, without a host sync."""
        return self.step.skipped.clone() if self.step.skipped is not None else torch.zeros(())

    def add_adam(self, module_id: str, name: str, params: list[Tensor], lr: float,
                 max_grad_norm: float | None = None, eps: float = 1e-8,
                 betas: tuple[float, float] = (0.9, 0.999), *, flat: bool = False) -> None:
        """Register ``Adam(fused=True)`` over ``params`` (with global-norm clipping), its
        learning rate ``lr`` or, with ``lr_schedule: linear``, decaying from ``lr``.

        ``flat``: lay the parameters, their gradients and Adam's state out in flat buffers
        (:mod:`rlloop.learners.flat_buffers`), for an update that writes every gradient
        itself on every step (autograd would leave some None) on a CPU; ignored elsewhere.
        """
        optimizer = adam(params, lr, eps, betas)
        rate = learning_rate(lr, self.config.lr_schedule, self.config.lr_decay_steps)
        self.register_optimizer(module_id, name, optimizer, params, rate,
                                GradientClip(max_grad_norm))
        if flat and isinstance(optimizer, Adam) and optimizer.defaults["fused"] and all(
                p.device.type == "cpu" for p in params):
            optimizer.use_flat(FlatParameters(params))
        self.step.add(GuardedOptim(optimizer, params, max_grad_norm))

    def compiled(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` through ``torch.compile`` when the config asks for it (built once, on
        first use), else ``fn``. Compiled functions take tensors, not generators: draw
        random numbers outside and pass them in."""
        if not getattr(self.config, "compile", False):
            return fn
        name = fn.__name__
        if name not in self._compiled:
            self._compiled[name] = torch.compile(fn)
        return self._compiled[name]

    def whole_update(self, module: nn.Module, loss_fn: LossFn) -> WholeUpdate | None:
        """With ``compile``: the update of ``module`` by ``loss_fn`` compiled whole (loss,
        gradient, clip, Adam; built once, on first use) where :class:`WholeUpdate` takes
        the module and the optimisers; else ``None`` (eager, or :meth:`compiled` for the rest).
        """
        if not getattr(self.config, "compile", False):
            return None
        if self._whole is not None and self._whole.stale():  # a parameter was frozen
            self._whole = self._whole_supported = None
        if self._whole_supported is None:
            problem = WholeUpdate.unsupported(module, self.step)
            self._whole_supported = problem is None
            if problem is None:
                self._whole = WholeUpdate(module, loss_fn, self.step)
            else:
                warnings.warn(f"compile=true: {problem}, so the update cannot compile as "
                              "one graph; compiling the loss, with backward() and the "
                              "optimiser step left eager (slower on a CPU than compile="
                              "false)", stacklevel=2)
        return self._whole

    def update(self, batch: Transitions) -> dict[str, Tensor]:
        """One gradient update (``compiled``, ending in :attr:`step`), then
        :meth:`after_update`; returns the update's stats."""
        raise NotImplementedError

    def after_update(self) -> None:
        """Count the gradient update; update the target networks when one is due. With
        ``on_nonfinite=raise``, read the skip flag (a host sync) and raise if set."""
        if self.on_nonfinite == "raise" and bool(self.step.flag):
            raise self.nonfinite_error("loss or gradient")
        self.updates += 1
        if self.updates % self.target_update_every() == 0:
            for module_id in self.modules:
                self.update_targets(module_id)

    def target_update_every(self) -> int:
        """Gradient updates between target-network updates."""
        raise NotImplementedError

    def update_targets(self, module_id: str) -> None:
        """Move ``module_id``'s target networks towards its online networks."""
        raise NotImplementedError


class OffPolicyAlgorithmBase(AlgorithmBase):
    """Border's env step and optimisation step, rl8's collect and update, and the state.

    Args:
        section: The config section (``"dqn"``...), for error messages.
        env: The env settings.
    """

    config: OffPolicyConfig
    learner: OffPolicyLearnerBase
    loop: OffPolicyLoop
    #: DQN, SAC and TD3 build a DictEncoder; replay keeps Dict entries apart.
    supports_dict_obs = True
    #: The loop updates ``obs_stats`` and standardises observations where they are read.
    standardize_train_env = False

    def __init__(self, section: str, env: EnvSettings, config: OffPolicyConfig) -> None:
        check_env_settings(section, env.horizons_per_env_reset)
        super().__init__(env, obs_stats=observation_stats(section, env, config))
        #: Stochastic evaluation's own RNG: evaluating never shifts training's draws.
        self._eval_generator = new_generator(self.device, env.seed + EVAL_SEED_OFFSET)

    def _explore(self, obs: Tensor) -> Tensor:
        """The behaviour policy after warm-up: ``obs [N, ...] -> actions [N, ...]``."""
        raise NotImplementedError

    # ---- the off-policy cadence ------------------------------------------------------
    def env_step(self) -> int:
        return self.loop.env_step(self._explore)

    def optimize(self, env_steps: int) -> dict[str, Tensor | float] | None:
        """One optimisation step (``gradient_steps`` updates); None during warm-up."""
        if not self.loop.learning(env_steps):
            return None
        self.learner.before_gradient_based_update(env_steps)
        stats = self._optimize(env_steps)
        self.learner.after_gradient_based_update()
        return {**(stats or {}), **self._extra_stats(env_steps),
                "guard/skipped_updates": self.learner.skip_count()}

    def _optimize(self, env_steps: int) -> Mapping[str, Tensor] | None:
        return self.loop.optimize(env_steps, self._update)

    def _update(self, batch: Transitions, rows: Tensor | None) -> dict[str, Tensor]:
        return self.learner.update(batch)

    def _extra_stats(self, env_steps: int) -> dict[str, float]:
        return {}

    def episode_stats(self) -> Stats:
        return self.runner.episodes.stats()

    # ---- rl8's collect / update (plain Trainer) --------------------------------------
    def collect(self) -> Stats:
        return self.loop.collect(self._explore)

    def update(self, env_steps: int) -> Stats:
        return self.loop.update(env_steps, self.optimize)

    # ---- state -----------------------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        return {**super().get_state(), "learner": self.learner.get_state(),
                "offpolicy": self.loop.get_state(), "updates": self.learner.updates,
                "eval_generator": self._eval_generator.get_state()}

    def set_state(self, state: dict[str, Any]) -> None:
        super().set_state(state)
        self.learner.set_state(state["learner"])
        self.loop.set_state(state["offpolicy"])
        if getattr(self.runner, "restarted_at_resume", False):
            self.loop.restart_episodes()
        self.learner.updates = saved_count(state["updates"], "algorithm.updates")
        set_generator_state(self._eval_generator, state["eval_generator"],
                            derive_seed(self.settings.seed, "evaluation-resumed"))


def observation_stats(section: str, env: EnvSettings, config: OffPolicyConfig
                      ) -> RunningMeanStd | None:
    """The running observation statistics of ``normalize_obs`` (None when off).

    A Dict observation arrives flat (its entries concatenated, ``EnvSpec.obs_parts``), so
    per-element statistics of the row are each entry's own, as VecNormalize keeps them
    per key; its action-mask features are the algorithm's to refuse (DQN does).

    Raises:
        ConfigError: image observations, or a Dict with image entries: the off-policy
            networks take pixels scaled to ``[0, 1]``, never standardised per pixel.
    """
    if not config.normalize_obs:
        return None
    spec = env.spec
    images = [key for key, _, image in spec.obs_parts if image]
    if images:
        raise ConfigError(f"{section}.normalize_obs takes vector entries, but {env.env_id}'s "
                          f"Dict observation has image entries {images}; set "
                          f"{section}.normalize_obs=false or drop them from the observation")
    if spec.obs_dtype != torch.float32:
        raise ConfigError(f"{section}.normalize_obs takes vector (float32) observations, not "
                          f"{env.env_id}'s ({spec.obs_dtype}); set "
                          f"{section}.normalize_obs=false")
    return RunningMeanStd(spec.obs_shape, device=resolve_device(env.device))


def continuous_actions(section: str, env: EnvSettings) -> tuple[Box, Callable[[Tensor], Tensor]]:
    """The env's Box action space and the map from ``[-1, 1]`` to its bounds.

    Raises:
        ConfigError: discrete actions, or an unbounded box.
    """
    space = env.spec.action_space
    if not isinstance(space, Box):
        raise ConfigError(f"{section} needs continuous (Box) actions but {env.env_id} has "
                          "discrete ones; use dqn or ppo")
    return space, box_rescaler(section, space, resolve_device(env.device))
