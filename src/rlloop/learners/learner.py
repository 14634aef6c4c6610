"""The learner: owns modules and their optimisers, turns batches into updates.

One learner holds a dict of modules keyed by ``module_id`` (a single-agent run has
one, ``"default_policy"``). Optimisers are registered by ``(module_id, name)`` so an
algorithm with several (SAC: actor, critic, alpha) and a run with several modules
(multi-agent) use the same machinery. An algorithm subclasses :class:`Learner` once
and overrides two hooks: :meth:`configure_optimizers_for_module` and
:meth:`compute_loss_for_module`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

import torch
from torch import Tensor, nn

from rlloop.errors import RlloopError
from rlloop.learners.schedules import Schedule, make_schedule

DEFAULT_MODULE_ID = "default_policy"
ClipBy = Literal["global_norm", "norm", "value"]
STATE_COMPONENTS = ("module", "optimizer", "weights_seq_no", "should_module_be_updated")


class LearnerError(ValueError):
    """Misuse of the learner API: unknown module or optimiser, bad params."""


class NonFiniteError(RlloopError, FloatingPointError):
    """A NaN or infinity reached a loss or gradient with ``on_nonfinite="raise"``."""


class TensorBatch:
    """Mixin for frozen dataclasses of ``[B, ...]`` tensors: length and row selection."""

    def __len__(self) -> int:
        return int(getattr(self, dataclasses.fields(self)[0].name).shape[0])  # type: ignore[arg-type]

    def select(self, index: Tensor):  # type: ignore[no-untyped-def]
        """The rows ``index`` of every field (``None`` fields stay ``None``)."""
        return dataclasses.replace(  # type: ignore[type-var]
            self,  # type: ignore[arg-type]
            **{f.name: (v[index] if (v := getattr(self, f.name)) is not None else None)
               for f in dataclasses.fields(self)},  # type: ignore[arg-type]
        )


BatchT = TypeVar("BatchT", bound=TensorBatch)


@dataclass
class GradientClip:
    """How gradients of one optimiser are post-processed before its step.

    Attributes:
        max: Threshold; ``None`` disables clipping.
        by: ``"global_norm"`` (all params together), ``"norm"`` (each tensor on its
            own) or ``"value"`` (elementwise to ``[-max, max]``).
    """

    max: float | None = None
    by: ClipBy = "global_norm"

    def __post_init__(self) -> None:
        if self.by not in ("global_norm", "norm", "value"):
            raise LearnerError(
                f"grad clip 'by' must be global_norm, norm or value, not {self.by!r}")
        if self.max is not None and self.max <= 0:
            raise LearnerError(f"grad clip max must be > 0 (or None to disable), got {self.max}")


@dataclass
class _Optim:
    optimizer: torch.optim.Optimizer
    params: list[Tensor]
    lr: Schedule
    clip: GradientClip = field(default_factory=GradientClip)


def _grad_norm(params: Sequence[Tensor]) -> Tensor:
    grads = [p.grad for p in params if p.grad is not None]
    return torch.nn.utils.get_total_norm(grads) if grads else torch.zeros(())


def clip_gradients(params: Sequence[Tensor], clip: GradientClip,
                   norm: Tensor | None = None) -> Tensor:
    """Post-process ``.grad`` of ``params`` in place; returns the global norm before clipping.

    ``norm`` may pass in the already computed global norm to save a pass over the grads.
    """
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(())
    if norm is None:
        norm = torch.nn.utils.get_total_norm(grads)
    if clip.max is None:
        return norm
    if clip.by == "global_norm":
        torch.nn.utils.clip_grads_with_norm_(params, clip.max, norm)
    elif clip.by == "norm":
        for g in grads:
            g.mul_((clip.max / (g.norm() + 1e-6)).clamp(max=1.0))
    else:
        for g in grads:
            g.clamp_(-clip.max, clip.max)
    return norm


class Learner(Generic[BatchT]):
    """Base learner. Subclasses implement the two hooks; everything else is shared.

    Args:
        modules: ``{module_id: module}``.
        config: The algorithm config, handed to the hooks (``config_for_module``).
        policies_to_train: Module ids to update, a predicate on the id, or ``None``
            for all.
        on_nonfinite: What a NaN/inf in a batch, loss or gradient does: ``"skip"`` the
            update (counted in ``guard/skipped_updates``) or ``"raise"``.
    """

    def __init__(
        self,
        modules: Mapping[str, nn.Module],
        config: Any,
        *,
        policies_to_train: Iterable[str] | Callable[[str], bool] | None = None,
        on_nonfinite: Literal["skip", "raise"] = "skip",
    ) -> None:
        self.config = config
        self.on_nonfinite = on_nonfinite
        self.skipped_updates = 0
        self.modules = nn.ModuleDict()
        self._optims: dict[tuple[str, str], _Optim] = {}
        self.env_steps = 0
        self.weights_seq_no = 0
        self.set_policies_to_train(policies_to_train)
        for module_id, module in modules.items():
            self.add_module(module_id, module)

    # ---- hooks ---------------------------------------------------------------------
    def configure_optimizers_for_module(self, module_id: str, config: Any) -> None:
        """Register this module's optimisers with :meth:`register_optimizer`."""
        raise NotImplementedError

    def compute_loss_for_module(
        self, module_id: str, config: Any, batch: BatchT
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """The scalar loss of one module on its minibatch, and detached stats."""
        raise NotImplementedError

    def config_for_module(self, module_id: str) -> Any:
        return self.config

    # ---- modules -------------------------------------------------------------------
    def add_module(self, module_id: str, module: nn.Module) -> None:
        """Add a module (also while training) and give it its optimisers."""
        if module_id in self.modules:
            raise LearnerError(f"module {module_id!r} exists already; remove it first")
        self.modules[module_id] = module
        self.configure_optimizers_for_module(module_id, self.config_for_module(module_id))

    def remove_module(self, module_id: str) -> nn.Module:
        """Remove a module with its optimisers; returns the module."""
        self._check_module(module_id)
        for key in [k for k in self._optims if k[0] == module_id]:
            del self._optims[key]
        module = self.modules[module_id]
        del self.modules[module_id]
        return module

    def set_policies_to_train(
        self, policies: Iterable[str] | Callable[[str], bool] | None
    ) -> None:
        self._train_ids: frozenset[str] | None = None
        self._train_fn: Callable[[str], bool] | None = None
        if callable(policies):
            self._train_fn = policies
        elif policies is not None:
            self._train_ids = frozenset(policies)

    def should_module_be_updated(self, module_id: str) -> bool:
        if self._train_fn is not None:
            return bool(self._train_fn(module_id))
        return self._train_ids is None or module_id in self._train_ids

    def _check_module(self, module_id: str) -> None:
        if module_id not in self.modules:
            raise LearnerError(
                f"unknown module {module_id!r}; this learner has {sorted(self.modules)}")

    # ---- optimisers ----------------------------------------------------------------
    def register_optimizer(
        self,
        module_id: str,
        name: str,
        optimizer: torch.optim.Optimizer,
        params: Sequence[Tensor],
        lr_or_schedule: float | dict[str, Any] | Schedule,
        clip: GradientClip | None = None,
    ) -> None:
        """Register ``optimizer`` over ``params`` under ``(module_id, name)``."""
        self._check_module(module_id)
        if not isinstance(params, Sequence) or not all(isinstance(p, Tensor) for p in params):
            raise LearnerError(
                f"params for optimizer {module_id}/{name} must be a list of tensors")
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

    # ---- updates -------------------------------------------------------------------
    def before_gradient_based_update(self, env_steps: int) -> dict[str, float]:
        """Advance schedules to ``env_steps``; returns the current learning rates."""
        self.env_steps = env_steps
        rates = {}
        for (module_id, name), opt in self._optims.items():
            lr = opt.lr(env_steps)
            for group in opt.optimizer.param_groups:
                group["lr"] = lr
            rates[f"{module_id}/lr_{name}"] = lr
        return rates

    def after_gradient_based_update(self) -> None:
        self.weights_seq_no += 1

    def update_minibatch(self, batch: Mapping[str, BatchT]) -> dict[str, Tensor]:
        """One gradient step on every module to be updated that has data in ``batch``.

        A non-finite loss or gradient skips the whole step (no optimiser moves), counts
        ``guard/skipped_updates`` and, with ``on_nonfinite="raise"``, raises
        :class:`NonFiniteError` instead, so weights never become NaN.
        """
        stats: dict[str, Tensor] = {}
        total: Tensor | None = None
        ids = [m for m in batch if self._updatable(m)]
        for module_id in ids:
            loss, module_stats = self.compute_loss_for_module(
                module_id, self.config_for_module(module_id), batch[module_id])
            total = loss if total is None else total + loss
            stats.update(_prefixed(module_id, module_stats, len(self.modules)))
        if total is None:
            return stats
        if not bool(torch.isfinite(total)):
            return self._skip("loss", stats)
        optims = [(key, o) for key, o in self._optims.items() if key[0] in ids]
        for _, o in optims:
            o.optimizer.zero_grad(set_to_none=True)
        total.backward()  # type: ignore[no-untyped-call]
        norms = {key: _grad_norm(o.params) for key, o in optims}
        if not all(bool(torch.isfinite(n)) for n in norms.values()):
            for _, o in optims:
                o.optimizer.zero_grad(set_to_none=True)
            return self._skip("gradient", stats)
        for (module_id, name), o in optims:
            clip_gradients(o.params, o.clip, norms[(module_id, name)])
            stats[f"{module_id}/gradients_{name}_global_norm"] = norms[(module_id, name)]
            o.optimizer.step()
        return stats

    def _skip(self, what: str, stats: dict[str, Tensor]) -> dict[str, Tensor]:
        self.skipped_updates += 1
        if self.on_nonfinite == "raise":
            raise NonFiniteError(
                f"non-finite {what} at env step {self.env_steps} (update "
                f"{self.weights_seq_no}); the update was not applied. Lower the learning rate "
                "or check the env's observations and rewards, or set on_nonfinite=skip")
        return {k: v for k, v in stats.items() if bool(torch.isfinite(v))}

    def batch_is_finite(self, batch: Mapping[str, BatchT]) -> bool:
        """True if every float tensor of every module's batch is finite."""
        for b in batch.values():
            for f in dataclasses.fields(b):  # type: ignore[arg-type]
                v = getattr(b, f.name)
                if isinstance(v, Tensor) and v.is_floating_point() and not bool(
                        torch.isfinite(v).all()):
                    return False
        return True

    def update_from_batch(
        self,
        batch: Mapping[str, BatchT],
        *,
        num_epochs: int = 1,
        minibatch_size: int | None = None,
        shuffle_batch_per_epoch: bool = True,
        generator: torch.Generator | None = None,
        stop: Callable[[dict[str, Tensor]], bool] | None = None,
    ) -> dict[str, float]:
        """``num_epochs`` passes over ``batch`` in minibatches; mean stats over all steps.

        ``stop`` is asked after every minibatch with its stats (e.g. PPO's target-KL
        early stop); when it says so the remaining minibatches are skipped.
        """
        for module_id in batch:
            self._check_module(module_id)
        if not self.batch_is_finite(batch):
            self._skip("observation, reward or target in the batch", {})
            return {"guard/skipped_updates": float(self.skipped_updates)}
        sizes = {m: len(b) for m, b in batch.items()}
        n_max = max(sizes.values())
        num_mb = 1 if not minibatch_size else max(1, -(-n_max // minibatch_size))
        history: list[dict[str, Tensor]] = []
        stopped = False
        for _ in range(num_epochs):
            orders = {m: (torch.randperm(n, generator=generator) if shuffle_batch_per_epoch
                          else torch.arange(n)) for m, n in sizes.items()}
            chunks = {m: order.chunk(num_mb) for m, order in orders.items()}
            for i in range(num_mb):
                mb = {m: batch[m].select(c[i]) for m, c in chunks.items() if i < len(c)}
                step_stats = self.update_minibatch(mb)
                history.append(step_stats)
                if stop is not None and stop(step_stats):
                    stopped = True
                    break
            if stopped:
                break
        self.after_gradient_based_update()
        out = _mean_stats(history)
        out["learner/minibatch_updates"] = float(len(history))
        out["learner/weights_seq_no"] = float(self.weights_seq_no)
        out["guard/skipped_updates"] = float(self.skipped_updates)
        return out

    def _updatable(self, module_id: str) -> bool:
        return module_id in self.modules and self.should_module_be_updated(module_id)

    # ---- state ---------------------------------------------------------------------
    def get_state(
        self,
        components: str | Iterable[str] | None = None,
        not_components: str | Iterable[str] | None = None,
    ) -> dict[str, Any]:
        """The learner's state, restricted to ``components`` minus ``not_components``."""
        wanted = _select(components, not_components)
        state: dict[str, Any] = {}
        if "module" in wanted:
            state["module"] = {m: mod.state_dict() for m, mod in self.modules.items()}
        if "optimizer" in wanted:
            state["optimizer"] = {f"{m}/{n}": o.optimizer.state_dict()
                                  for (m, n), o in self._optims.items()}
        if "weights_seq_no" in wanted:
            state["weights_seq_no"] = self.weights_seq_no
            state["env_steps"] = self.env_steps
        if "should_module_be_updated" in wanted:
            state["should_module_be_updated"] = [
                m for m in self.modules if self.should_module_be_updated(m)]
        return state

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`get_state` returned (any subset of components)."""
        for module_id, sd in state.get("module", {}).items():
            self._check_module(module_id)
            self.modules[module_id].load_state_dict(sd)
        for key, sd in state.get("optimizer", {}).items():
            module_id, _, name = key.rpartition("/")
            self.get_optimizer(module_id, name).load_state_dict(sd)
        # A newer weights_seq_no wins: stale state never rolls the counter back.
        if "weights_seq_no" in state:
            self.weights_seq_no = max(self.weights_seq_no, int(state["weights_seq_no"]))
            self.env_steps = int(state.get("env_steps", self.env_steps))
        if "should_module_be_updated" in state:
            self.set_policies_to_train(list(state["should_module_be_updated"]))

    def parameter_counts(self) -> dict[str, int]:
        """Trainable and non-trainable parameter counts over all modules."""
        params = list(self.modules.parameters())
        trainable = sum(p.numel() for p in params if p.requires_grad)
        return {"learner/params_trainable": trainable,
                "learner/params_frozen": sum(p.numel() for p in params) - trainable}


def _select(components: str | Iterable[str] | None,
            not_components: str | Iterable[str] | None) -> set[str]:
    def as_set(x: str | Iterable[str] | None) -> set[str]:
        return {x} if isinstance(x, str) else set(x or ())

    wanted = as_set(components) or set(STATE_COMPONENTS)
    unknown = (wanted | as_set(not_components)) - set(STATE_COMPONENTS)
    if unknown:
        raise LearnerError(f"unknown state components {sorted(unknown)}; "
                           f"choose from {list(STATE_COMPONENTS)}")
    return wanted - as_set(not_components)


def _prefixed(module_id: str, stats: Mapping[str, Tensor], n_modules: int) -> dict[str, Tensor]:
    # A single-module run keeps flat keys ("losses/policy"), as rl8 and the README show.
    if n_modules == 1:
        return dict(stats)
    return {f"{module_id}/{k}": v for k, v in stats.items()}


def _mean_stats(history: Sequence[Mapping[str, Tensor]]) -> dict[str, float]:
    keys: dict[str, list[Tensor]] = {}
    for stats in history:
        for k, v in stats.items():
            keys.setdefault(k, []).append(v.detach().float())
    return {k: float(torch.stack(vs).mean()) for k, vs in keys.items()}
