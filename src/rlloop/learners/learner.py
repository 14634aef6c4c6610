"""The learner: owns modules and their optimisers, turns batches into updates.

One learner holds a dict of modules keyed by ``module_id`` (a single-agent run has
one, ``"default_policy"``). Optimisers are registered by ``(module_id, name)`` so an
algorithm with several (SAC: actor, critic, alpha) and a run with several modules
(multi-agent, leagues) use the same machinery. An algorithm subclasses :class:`Learner`
once and overrides two hooks: :meth:`~Learner.configure_optimizers_for_module` (optimisers and
scheduled hyperparameters) and :meth:`~Learner.compute_loss_for_module`;
:meth:`~Learner.forward_train` and :meth:`~Learner.build_batch` are optional.

Every number the learner reports goes through its :class:`MetricsLogger` (``metrics``):
per-update means of the loss stats, learning rates and scheduled hyperparameters, global
gradient norms, and lifetime sample counts with throughput. A module's keys are flat
(``"losses/policy"``) while it is the only module, else prefixed (``"a/losses/policy"``).

The class is RLlib's whole learner surface, the hooks an algorithm overrides first; its
parts that need no learner live beside it: the non-finite guard
(:mod:`~rlloop.learners.nonfinite`), minibatch cutting (:mod:`~rlloop.learners.minibatches`)
and the state's components and checks (:mod:`~rlloop.learners.learner_state`).
"""

from __future__ import annotations

import dataclasses
import inspect
import itertools
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

import torch
from torch import Tensor, nn

from rlloop.config.gradient_clip import ClipBy, GradientClip, LearnerError
from rlloop.config.schedules import Schedule, make_schedule
from rlloop.data.batch import TensorBatch
from rlloop.learners.gradients import clip_gradients, grad_norm
from rlloop.learners.learner_state import (
    check_saved_weights,
    cloned,
    nonfinite_weights,
    select_components,
)
from rlloop.learners.minibatches import chunk_bounds, epoch_minibatches, micro_batch_count
from rlloop.learners.nonfinite import (
    SKIPPED_KEY,
    NonFiniteError,
    all_finite,
    arm_device_skip,
    batch_is_finite,
    nonfinite_error,
)
from rlloop.learners.optim_step import arm_skip
from rlloop.logging.metrics import MetricsLogger

__all__ = ["DEFAULT_MODULE_ID", "ClipBy", "GradientClip", "Learner", "LearnerError",
           "TensorBatch", "UnknownModuleError", "clip_gradients"]

DEFAULT_MODULE_ID = "default_policy"
#: An ``nn.Module`` or a spec: anything that builds one when called without arguments
#: (a module class, ``functools.partial(ActorCritic, obs_shape, space)``, a lambda).
ModuleOrSpec = nn.Module | Callable[[], nn.Module]
PoliciesToTrain = Iterable[str] | Callable[[str], bool] | None


class UnknownModuleError(LearnerError, KeyError):
    """A module id (in a batch, a state or a call) that this learner does not hold."""

    def __str__(self) -> str:  # KeyError would print the message with quotes around it
        return str(self.args[0])


BatchT = TypeVar("BatchT", bound=TensorBatch)
MultiBatch = Mapping[str, BatchT]


@dataclass
class _Optim:
    optimizer: torch.optim.Optimizer
    params: list[Tensor]
    lr: Schedule
    clip: GradientClip = dataclasses.field(default_factory=GradientClip)


class Learner(Generic[BatchT]):
    """Base learner. Subclasses implement the hooks; everything else is shared.

    Args:
        modules: ``{module_id: module or spec}``.
        config: The algorithm config, handed to the hooks (see :meth:`config_for_module`).
        policies_to_train: Module ids to update, a predicate on the id, or ``None``
            for all.
        on_nonfinite: What a NaN/inf in a batch, loss or gradient does: ``"skip"`` the
            update (counted in ``guard/skipped_updates``) or ``"raise"``.
        module_configs: Per-module config overrides for ``modules`` (as in
            :meth:`add_module`).
        stats_prefix: ``"auto"``: stats keys are flat while there is one module, else
            prefixed with the module id; ``"always"``: always prefixed (leagues, where the
            module count changes while training and keys should not).
    """

    def __init__(
        self,
        modules: Mapping[str, ModuleOrSpec],
        config: Any,
        *,
        policies_to_train: PoliciesToTrain = None,
        on_nonfinite: Literal["skip", "raise"] = "skip",
        module_configs: Mapping[str, Mapping[str, Any]] | None = None,
        stats_prefix: Literal["auto", "always"] = "auto",
    ) -> None:
        self.config = config
        self.on_nonfinite = on_nonfinite
        self.stats_prefix = stats_prefix
        self.skipped_updates = 0
        #: Gradient steps tried, skipped ones included; a batch refused whole for a NaN/inf
        #: counts as one. With ``skipped_updates``, the share of updates a run skipped.
        self.tried_updates = 0
        self.modules = nn.ModuleDict()
        self.metrics = MetricsLogger()
        self._optims: dict[tuple[str, str], _Optim] = {}
        self._hparams: dict[tuple[str, str], Schedule] = {}
        self._module_configs: dict[str, Any] = {}
        self.env_steps = 0
        self.weights_seq_no = 0
        #: Rows per forward/backward pass (:meth:`forward_backward`); ``None``: whole
        #: minibatches.
        self.micro_batch: int | None = None
        self._train_ids: frozenset[str] | None = None
        self._train_fn: Callable[[str], bool] | None = None
        # Learners written before ``fwd_out`` existed take (module_id, config, batch).
        sig = inspect.signature(self.compute_loss_for_module).parameters
        self._loss_takes_fwd_out = len(sig) >= 4
        self.set_policies_to_train(policies_to_train)
        for module_id, module in modules.items():
            self.add_module(module_id, module, (module_configs or {}).get(module_id))

    # ---- hooks ---------------------------------------------------------------------
    def configure_optimizers_for_module(self, module_id: str, config: Any) -> None:
        """Register this module's optimisers (:meth:`register_optimizer`) and scheduled
        hyperparameters (:meth:`register_hyperparameter`). Called for every added module."""
        raise NotImplementedError

    def forward_train(self, module_id: str, batch: BatchT) -> Any:
        """Run the module once on its minibatch; the result is ``fwd_out`` of the loss.

        The default computes nothing (``None``): the loss may run the module itself.
        """
        return None

    def compute_loss_for_module(
        self, module_id: str, config: Any, batch: BatchT, fwd_out: Any = None
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """The scalar loss of one module on its minibatch, and detached stats."""
        raise NotImplementedError

    def build_batch(self, episodes: Sequence[Any]) -> MultiBatch[BatchT]:
        """Turn episodes into ``{module_id: batch}`` for :meth:`update_from_episodes`
        (RLlib's learner connector)."""
        raise LearnerError(f"{type(self).__name__} cannot learn from episodes: override "
                           "build_batch(episodes) -> {module_id: batch}")

    def compute_losses(
        self, batch: MultiBatch[BatchT], fwd_out: Mapping[str, Any]
    ) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """Per-module losses (the update minimises their sum) and prefixed stats."""
        losses: dict[str, Tensor] = {}
        stats: dict[str, Tensor] = {}
        for module_id, module_batch in batch.items():
            config = self.config_for_module(module_id)
            if self._loss_takes_fwd_out:
                loss, module_stats = self.compute_loss_for_module(
                    module_id, config, module_batch, fwd_out.get(module_id))
            else:
                loss, module_stats = self.compute_loss_for_module(  # type: ignore[call-arg]
                    module_id, config, module_batch)
            losses[module_id] = loss
            stats.update({self._stat_key(module_id, k): v for k, v in module_stats.items()})
        return losses, stats

    def config_for_module(self, module_id: str) -> Any:
        """The config with this module's overrides applied."""
        return self._module_configs.get(module_id, self.config)

    # ---- modules -------------------------------------------------------------------
    def add_module(self, module_id: str, spec_or_module: ModuleOrSpec,
                   config_overrides: Mapping[str, Any] | None = None) -> nn.Module:
        """Add a module (also while training), give it its optimisers; returns it.

        ``config_overrides`` replace fields of the config for this module only (e.g.
        ``{"lr": 1e-4}``); :meth:`config_for_module` returns the result.
        """
        if module_id in self.modules:
            raise LearnerError(f"module {module_id!r} exists already; remove it first")
        module = spec_or_module if isinstance(spec_or_module, nn.Module) else spec_or_module()
        if not isinstance(module, nn.Module):
            raise LearnerError(f"module {module_id!r}: the spec built a "
                               f"{type(module).__name__}, not a torch nn.Module")
        if config_overrides:
            self._module_configs[module_id] = _override(self.config, config_overrides)
        self.modules[module_id] = module
        try:
            self.configure_optimizers_for_module(module_id, self.config_for_module(module_id))
        except BaseException:
            self._forget(module_id)
            raise
        self._log_parameter_counts()
        return module

    def remove_module(self, module_id: str) -> nn.Module:
        """Remove a module with its optimisers, schedules, config and metrics; returns it."""
        self._check_module(module_id)
        module = self.modules[module_id]
        self._forget(module_id)
        self._log_parameter_counts()
        return module

    def _forget(self, module_id: str) -> None:
        for key in [k for k in self._optims if k[0] == module_id]:
            del self._optims[key]
        for key in [k for k in self._hparams if k[0] == module_id]:
            del self._hparams[key]
        self._module_configs.pop(module_id, None)
        self.metrics.delete(module_id)
        if self._train_ids is not None:
            self._train_ids = self._train_ids - {module_id}
        if module_id in self.modules:
            del self.modules[module_id]

    def set_policies_to_train(self, policies: PoliciesToTrain) -> None:
        """Which modules updates touch: ids, a predicate on the id, or ``None`` for all."""
        self._train_ids = None
        self._train_fn = None
        if callable(policies):
            self._train_fn = policies
        elif isinstance(policies, str):
            raise LearnerError(f"policies_to_train must be a list of module ids, got the "
                               f"string {policies!r}; write [{policies!r}]")
        elif policies is not None:
            self._train_ids = frozenset(policies)

    def should_module_be_updated(self, module_id: str) -> bool:
        if self._train_fn is not None:
            return bool(self._train_fn(module_id))
        return self._train_ids is None or module_id in self._train_ids

    def _check_module(self, module_id: str) -> None:
        if module_id not in self.modules:
            raise UnknownModuleError(
                f"unknown module {module_id!r}; this learner has {sorted(self.modules)}")

    # ---- optimisers and scheduled hyperparameters --------------------------------------
    def register_optimizer(
        self,
        module_id: str,
        name: str,
        optimizer: torch.optim.Optimizer,
        params: Sequence[Tensor],
        lr_or_schedule: float | dict[str, Any] | Schedule,
        clip: GradientClip | None = None,
    ) -> None:
        """Register ``optimizer`` over ``params`` under ``(module_id, name)``.

        ``lr_or_schedule`` (a number, a schedule dict or a schedule) sets the learning
        rate from the env-step timeline before every update.
        """
        self._check_module(module_id)
        if (module_id, name) in self._optims:
            raise LearnerError(f"optimizer {module_id}/{name} is registered already")
        if not isinstance(params, Sequence) or not all(isinstance(p, Tensor) for p in params):
            raise LearnerError(
                f"params for optimizer {module_id}/{name} must be a list of tensors "
                "(e.g. list(module.parameters())), not a generator or other objects")
        owned = {id(p) for group in optimizer.param_groups for p in group["params"]}
        if {id(p) for p in params} != owned:
            raise LearnerError(f"params for optimizer {module_id}/{name} must be exactly the "
                               "tensors the optimizer updates (clipping acts on them)")
        sched = make_schedule(lr_or_schedule)
        for group in optimizer.param_groups:
            group["lr"] = sched(self.env_steps)
        self._optims[(module_id, name)] = _Optim(optimizer, list(params), sched,
                                                 clip or GradientClip())

    def get_optimizer(self, module_id: str, name: str = "default") -> torch.optim.Optimizer:
        try:
            return self._optims[(module_id, name)].optimizer
        except KeyError:
            known = [f"{m}/{n}" for m, n in self._optims]
            raise LearnerError(
                f"no optimizer {module_id}/{name}; registered: {known}") from None

    def get_optimizers_for_module(self, module_id: str) -> dict[str, torch.optim.Optimizer]:
        self._check_module(module_id)
        return {n: o.optimizer for (m, n), o in self._optims.items() if m == module_id}

    def register_hyperparameter(self, module_id: str, name: str,
                                value_or_schedule: float | dict[str, Any] | Schedule) -> None:
        """Put a scalar (entropy coefficient, clip range, epsilon) on the env-step timeline;
        read it with :meth:`hyperparameter`. Its value is logged with every update."""
        self._check_module(module_id)
        self._hparams[(module_id, name)] = make_schedule(value_or_schedule)

    def hyperparameter(self, module_id: str, name: str) -> float:
        """The current value of a registered hyperparameter (at ``env_steps``)."""
        try:
            return self._hparams[(module_id, name)](self.env_steps)
        except KeyError:
            known = [f"{m}/{n}" for m, n in self._hparams]
            raise LearnerError(f"no hyperparameter {module_id}/{name}; registered: "
                               f"{known}") from None

    # ---- updates -------------------------------------------------------------------
    def before_gradient_based_update(self, env_steps: int) -> dict[str, float]:
        """Advance schedules to ``env_steps`` and log their values; returns the learning
        rates as ``{"<module>/lr_<optim>": lr}``."""
        self.env_steps = env_steps
        rates = {}
        for (module_id, name), opt in self._optims.items():
            lr = opt.lr(env_steps)
            for group in opt.optimizer.param_groups:
                group["lr"] = lr
            rates[f"{module_id}/lr_{name}"] = lr
            self._log_scalar(module_id, f"lr_{name}", lr)
        for (module_id, name), sched in self._hparams.items():
            self._log_scalar(module_id, name, sched(env_steps))
        return rates

    def after_gradient_based_update(self) -> None:
        self.weights_seq_no += 1

    def reduce_gradients(self) -> None:
        """Combine the gradients in ``.grad`` with other learners' before they are clipped
        (:mod:`rlloop.learners.distributed`); one learner has nothing to do."""

    def close(self) -> None:
        """Release the processes or process group the learner uses (none here)."""

    def prepare_minibatch(self, module_id: str, batch: BatchT) -> BatchT:
        """One module's whole minibatch before it is split into micro-batches (or a learner
        group's shards): the place for statistics over the whole minibatch, such as PPO's
        advantage standardisation. The default returns it as it is."""
        return batch

    def update_minibatch(self, batch: MultiBatch[BatchT]) -> dict[str, Tensor]:
        """One gradient step on every module to be updated that has data in ``batch``.

        A non-finite loss or gradient skips the whole step (no optimiser moves), counts
        ``guard/skipped_updates`` and, with ``on_nonfinite="raise"``, raises
        :class:`NonFiniteError` instead, so weights never become NaN.
        """
        ids = [m for m in batch if self._updatable(m)]
        if not ids:
            return {}
        return self.gradient_step({m: self.prepare_minibatch(m, batch[m]) for m in ids})

    def gradient_step(self, mb: MultiBatch[BatchT]) -> dict[str, Tensor]:
        """:meth:`update_minibatch` on prepared minibatches of modules to be updated."""
        optims = [(key, o) for key, o in self._optims.items() if key[0] in mb]
        self.tried_updates += 1
        for _, o in optims:
            o.optimizer.zero_grad(set_to_none=True)
        losses, stats = self.forward_backward(mb)
        total = total_loss(losses.values())
        self.reduce_gradients()
        norms = {key: grad_norm(o.params) for key, o in optims}
        finite = self.agreed(all_finite(torch.stack([total, *norms.values()])))
        skipped = self._skip_on_device(optims, finite)
        # Else one host read per minibatch for the loss and every gradient norm together.
        if skipped is None and not bool(finite):
            for _, o in optims:
                o.optimizer.zero_grad(set_to_none=True)
            what = "loss" if not bool(torch.isfinite(total)) else "gradient"
            return self._skip(what, stats)
        for (module_id, name), o in optims:
            clip_gradients(o.params, o.clip, norms[(module_id, name)])
            if o.clip.log_global_norm:
                stats[f"{module_id}/gradients_{name}_global_norm"] = norms[(module_id, name)]
            o.optimizer.step()
            if skipped is not None:
                arm_skip(o.optimizer, None)
        if skipped is not None:
            stats[SKIPPED_KEY] = skipped
        for module_id, module_batch in mb.items():
            stats[self._stat_key(module_id, "losses/total")] = losses[module_id]
            n = self.samples_trained(module_id, module_batch)
            self.metrics.log_value((module_id, "num_samples_trained_lifetime"), n, reduce="sum")
            self.metrics.log_value("learner/num_samples_trained", n, reduce="sum",
                                   clear_on_reduce=True)
            self.metrics.log_value("learner/num_samples_trained_lifetime", n, reduce="sum",
                                   with_throughput=True)
        return stats

    def agreed(self, finite: Tensor) -> Tensor:
        """Whether the step is finite, as every learner of a group sees it (one here)."""
        return finite

    def samples_trained(self, module_id: str, batch: Any) -> int:
        """The rows a gradient step on ``batch`` trains ``module_id`` on."""
        return int(batch.num_samples()) if isinstance(batch, TensorBatch) else len(batch)

    def micro_batches(self, mb: MultiBatch[BatchT]) -> int:
        """How many forward/backward passes :meth:`forward_backward` splits ``mb`` into:
        enough that none has more than ``micro_batch`` rows (1 when that is ``None``)."""
        return micro_batch_count(mb, self.micro_batch)

    def forward_backward(self, mb: MultiBatch[BatchT]
                         ) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """Forward, losses and backward of one gradient step; the gradients accumulate in
        ``.grad``. Returns the detached per-module losses and the stats.

        With several micro-batches each module's minibatch is cut into consecutive row
        ranges; a range's loss and stats weigh ``rows / minibatch rows``, so the gradient
        and every per-sample mean equal the whole minibatch's (the losses must be means over
        rows, and whole-minibatch statistics belong in :meth:`prepare_minibatch`)."""
        chunks = self.micro_batches(mb)
        if chunks == 1:
            losses, stats = self.compute_losses(mb, {m: self.forward_train(m, b)
                                                     for m, b in mb.items()})
            total_loss(losses.values()).backward()  # type: ignore[no-untyped-call]
            return {m: loss.detach() for m, loss in losses.items()}, stats
        summed: dict[str, Tensor] = {}
        summed_stats: dict[str, Tensor] = {}
        for module_id, module_batch in mb.items():
            n = len(module_batch)
            for start, stop in chunk_bounds(n, chunks):
                part = module_batch.rows(start, stop)
                weight = (stop - start) / n
                losses, stats = self.compute_losses(
                    {module_id: part}, {module_id: self.forward_train(module_id, part)})
                (losses[module_id] * weight).backward()  # type: ignore[no-untyped-call]
                for into, key, value in ((summed, module_id, losses[module_id]),
                                         *((summed_stats, k, v) for k, v in stats.items())):
                    value = value.detach() * weight
                    into[key] = into[key] + value if key in into else value
        return summed, summed_stats

    def _skip_on_device(self, optims: Sequence[tuple[tuple[str, str], _Optim]],
                        finite: Tensor) -> Tensor | None:
        """With ``on_nonfinite="skip"`` and optimisers that skip a step on the device
        (``Adam(fused=True)`` reads ``found_inf``, as under ``torch.amp.GradScaler``), arm
        them with ``not finite`` and return that flag (1.0: skipped): the step is decided
        without a host read. None where a host read must decide (``"raise"``, another
        optimiser, parameters on another device than the loss)."""
        if self.on_nonfinite != "skip":
            return None
        return arm_device_skip([(o.optimizer, o.params) for _, o in optims], finite)

    def _log_step_stats(self, steps: list[dict[str, Tensor]]) -> None:
        """Log the minibatches' stats, leaving out the non-finite ones of steps skipped on
        the device; their flags are read together, one host read per update."""
        marked = [i for i, stats in enumerate(steps) if SKIPPED_KEY in stats]
        flags = torch.stack([steps[i].pop(SKIPPED_KEY) for i in marked]).tolist() if marked \
            else []
        for i, flag in zip(marked, flags, strict=True):
            if flag:
                steps[i] = self._skip("loss or gradient", steps[i])
        for stats in steps:
            self.metrics.log_dict(stats, clear_on_reduce=True)

    def _skip_batch(self) -> None:
        """Skip a batch with a NaN/inf in it: one update tried and skipped."""
        self.tried_updates += 1
        self._skip("observation, reward or target in the batch", {})

    def _skip(self, what: str, stats: dict[str, Tensor]) -> dict[str, Tensor]:
        self.skipped_updates += 1
        if self.on_nonfinite == "raise":
            raise self.nonfinite_error(what)
        return {k: v for k, v in stats.items() if bool(torch.isfinite(v))}

    def nonfinite_error(self, what: str) -> NonFiniteError:
        """The error ``on_nonfinite="raise"`` raises for a non-finite ``what``."""
        return nonfinite_error(what, self.env_steps, self.weights_seq_no)

    def batch_is_finite(self, batch: MultiBatch[BatchT]) -> bool:
        """True if every float tensor of every module's batch is finite (one host read per
        device for the whole batch)."""
        return batch_is_finite(batch)

    def update_from_batch(
        self,
        batch: MultiBatch[BatchT],
        *,
        num_epochs: int = 1,
        minibatch_size: int | None = None,
        shuffle_batch_per_epoch: bool = True,
        generator: torch.Generator | None = None,
        stop: Callable[[dict[str, Tensor]], bool] | None = None,
        env_steps: int | None = None,
    ) -> dict[str, float]:
        """``num_epochs`` passes over ``batch`` in minibatches; returns the reduced metrics.

        ``stop`` is asked after every minibatch with its stats (e.g. PPO's target-KL
        early stop); when it says so the remaining minibatches are skipped. With
        ``env_steps``, :meth:`before_gradient_based_update` runs first.
        """
        if env_steps is not None:
            self.before_gradient_based_update(env_steps)
        self._check_batch(batch)
        batch = {m: b for m, b in batch.items() if len(b) > 0}
        if not self.batch_is_finite(batch):
            self._skip_batch()
            return self._finish(0)
        return self._run(epoch_minibatches(batch, num_epochs, minibatch_size,
                                           shuffle_batch_per_epoch, generator), stop)

    def update_from_episodes(self, episodes: Sequence[Any], **kwargs: Any) -> dict[str, float]:
        """:meth:`build_batch` on ``episodes``, then :meth:`update_from_batch` (same kwargs)."""
        return self.update_from_batch(self.build_batch(episodes), **kwargs)

    def update_from_iterator(
        self,
        iterator: Iterable[MultiBatch[BatchT]],
        num_iters: int | None = None,
        *,
        stop: Callable[[dict[str, Tensor]], bool] | None = None,
        env_steps: int | None = None,
    ) -> dict[str, float]:
        """One gradient step per ``{module_id: minibatch}`` the iterator yields (at most
        ``num_iters``; all when ``None``), e.g. from a replay buffer or an offline dataset.
        Minibatches with non-finite values are skipped and counted."""
        if env_steps is not None:
            self.before_gradient_based_update(env_steps)

        def checked() -> Iterator[MultiBatch[BatchT]]:
            for mb in itertools.islice(iterator, num_iters):
                self._check_batch(mb)
                if self.batch_is_finite(mb):
                    yield mb
                else:
                    self._skip_batch()

        return self._run(checked(), stop)

    def _check_batch(self, batch: MultiBatch[BatchT]) -> None:
        for module_id in batch:
            self._check_module(module_id)

    def _run(self, minibatches: Iterable[MultiBatch[BatchT]],
             stop: Callable[[dict[str, Tensor]], bool] | None) -> dict[str, float]:
        steps: list[dict[str, Tensor]] = []
        for mb in minibatches:
            steps.append(self.update_minibatch(mb))
            if stop is not None and stop(steps[-1]):
                break
        self._log_step_stats(steps)
        self.after_gradient_based_update()
        return self._finish(len(steps))

    def _finish(self, steps: int) -> dict[str, float]:
        self.metrics.log_value("learner/minibatch_updates", steps, reduce="sum",
                               clear_on_reduce=True)
        self.metrics.log_value("learner/weights_seq_no", self.weights_seq_no, window=1)
        self.metrics.log_value("guard/skipped_updates", self.skipped_updates, window=1)
        return self.metrics.reduce()

    def _updatable(self, module_id: str) -> bool:
        return module_id in self.modules and self.should_module_be_updated(module_id)

    # ---- metrics -------------------------------------------------------------------
    def _flat(self) -> bool:
        return self.stats_prefix == "auto" and len(self.modules) == 1

    def _stat_key(self, module_id: str, key: str) -> str:
        return key if self._flat() else f"{module_id}/{key}"

    def _log_scalar(self, module_id: str, name: str, value: float) -> None:
        key = f"learner/{name}" if self._flat() else f"{module_id}/{name}"
        self.metrics.log_value(key, value, clear_on_reduce=True)

    def _log_parameter_counts(self) -> None:
        for key, value in self.parameter_counts().items():
            self.metrics.log_value(key, value, window=1)

    def parameter_counts(self) -> dict[str, int]:
        """Trainable and non-trainable (frozen) parameter counts over all modules."""
        params = list(self.modules.parameters())
        trainable = sum(p.numel() for p in params if p.requires_grad)
        return {"learner/params_trainable": trainable,
                "learner/params_frozen": sum(p.numel() for p in params) - trainable}

    # ---- state ---------------------------------------------------------------------
    def get_state(
        self,
        components: str | Iterable[str] | None = None,
        not_components: str | Iterable[str] | None = None,
    ) -> dict[str, Any]:
        """The learner's state, restricted to ``components`` minus ``not_components``."""
        wanted = select_components(components, not_components)
        state: dict[str, Any] = {}
        if "module" in wanted:
            state["module"] = {m: mod.state_dict() for m, mod in self.modules.items()}
        if "optimizer" in wanted:
            state["optimizer"] = {f"{m}/{n}": o.optimizer.state_dict()
                                  for (m, n), o in self._optims.items()}
        if "metrics_logger" in wanted:
            state["metrics_logger"] = self.metrics.get_state()
        if "weights_seq_no" in wanted:
            state["weights_seq_no"] = self.weights_seq_no
        if "env_steps" in wanted:
            state["env_steps"] = self.env_steps
        if "should_module_be_updated" in wanted:
            state["should_module_be_updated"] = [
                m for m in self.modules if self.should_module_be_updated(m)]
        return state

    def check_weights(self, modules: Mapping[str, Any]) -> None:
        """``SavedStateError`` unless each saved state dict in ``modules`` is one of this
        learner's modules' with the same names and shapes: ``load_state_dict`` copies the
        tensors that fit before it refuses the others (a transposed weight)."""
        check_saved_weights(self.modules, modules)

    def nonfinite_weights(self) -> list[str]:
        """``<module id>.<name>`` of each floating-point parameter or buffer holding a NaN
        or an infinity (one host sync for all of them)."""
        return nonfinite_weights(self.modules)

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`get_state` returned (any subset of components).

        ``should_module_be_updated`` comes back as the list of ids it named when saved.
        Saved weights that do not fit the built modules raise ``SavedStateError`` before
        any module is loaded (see :meth:`check_weights`).
        """
        self.check_weights(state.get("module", {}))
        for module_id, sd in state.get("module", {}).items():
            self.modules[module_id].load_state_dict(sd)
        for key, sd in state.get("optimizer", {}).items():
            module_id, _, name = key.rpartition("/")
            # Optimisers adopt same-device state tensors as they are: copy them, or two
            # learners restored from one state would step each other's moments.
            self.get_optimizer(module_id, name).load_state_dict(cloned(sd))
        if "metrics_logger" in state:
            self.metrics.set_state(state["metrics_logger"])
        # A newer weights_seq_no wins: stale state never rolls the counter back.
        if "weights_seq_no" in state:
            self.weights_seq_no = max(self.weights_seq_no, int(state["weights_seq_no"]))
        if "env_steps" in state:
            self.env_steps = int(state["env_steps"])
        if "should_module_be_updated" in state:
            self.set_policies_to_train(list(state["should_module_be_updated"]))


def total_loss(losses: Collection[Tensor]) -> Tensor:
    """The sum of the scalar ``losses`` as a 0-dim tensor: a single 0-dim loss is its own
    sum, bit for bit, and costs two ops and two autograd nodes fewer per step."""
    if len(losses) == 1:
        loss = next(iter(losses))
        if loss.dim() == 0:
            return loss
    return torch.stack(list(losses)).sum()


def _override(config: Any, overrides: Mapping[str, Any]) -> Any:
    """``config`` with ``overrides`` (a dataclass is re-validated by its ``__post_init__``)."""
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        try:
            return dataclasses.replace(config, **overrides)
        except TypeError as e:
            raise LearnerError(f"bad config_overrides {sorted(overrides)}: {e}") from None
    if isinstance(config, Mapping):
        return {**config, **overrides}
    raise LearnerError(f"config_overrides need a dataclass or mapping config, not "
                       f"{type(config).__name__}")
