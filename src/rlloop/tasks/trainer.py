"""Drives a :class:`~rlloop.tasks.base.Task` (``ml``'s RL trainer loop).

Each epoch: collect ``num_epoch_samples`` from the worker pool -> dataset of clips ->
minibatch train steps -> checkpoints. Checkpoints are written at epoch ends: ``SIGUSR1``
and ``checkpoint_every`` save at the end of the epoch they fall in and training goes on;
``SIGTERM``/``SIGINT`` end collection at once (the partial epoch is dropped) or let the
epoch's train steps finish (for up to ``stop_wait_s``), and a final checkpoint is saved,
as it is when the step budget is spent. Epoch ``k`` reseeds every env and orders its
minibatches from seeds derived from ``(env_seed, k)`` and ``(seed, k)``, so a run cut at
an epoch's end and resumed trains as the uncut one does (in ``sync`` mode; thread and
process workers batch in the order they answer). Train steps go through the same
numerical guard as rlloop's learners: a non-finite batch, loss or gradient skips the
step (``guard/skipped_updates``) or raises
:class:`~rlloop.learners.nonfinite.NonFiniteError` naming the step.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic

import numpy as np
import torch
from torch import Tensor, nn

from rlloop.checkpoint import CheckpointManager, capture_rng_state, restore_rng_state
from rlloop.config.gradient_clip import GradientClip
from rlloop.envs.pool import WorkerPool
from rlloop.errors import ConfigError, RunDirError
from rlloop.learners.gradients import clip_gradients, grad_norm
from rlloop.learners.nonfinite import NonFiniteError
from rlloop.logging import JsonlSink, MultiSink
from rlloop.logging.sinks import as_sink
from rlloop.system.devices import move_to
from rlloop.system.run_files import check_members
from rlloop.system.seeding import derive_seed, seed_global_rngs
from rlloop.system.signals import atomic, save_due, stop_requested_since, supervised
from rlloop.tasks.base import ModelT, Task
from rlloop.tasks.dataset import TrajectoryDataset, host_iter
from rlloop.tasks.sampling import SamplingStats
from rlloop.trainers.callbacks import Callback, UserCallbacks, as_callbacks
from rlloop.trainers.loop import MetricsSink, Stats, Trainer
from rlloop.trainers.stop_conditions import Condition

if TYPE_CHECKING:
    from rlloop.trainers.result import RunResult

COMPONENTS = ("model", "optimizer", "trainer", "rng")
_log = logging.getLogger(__name__)


class TaskTrainer(Generic[ModelT]):
    """Trains ``model`` on ``task``; with ``run_dir``, checkpoints and ``metrics.jsonl`` go
    there and ``resume=True`` continues from its newest checkpoint.

    It runs on the one :class:`~rlloop.trainers.loop.Trainer` loop (``self.trainer``) with a
    schedule whose iteration is one epoch. ``state`` holds the counters ``train/steps``,
    ``train/epochs`` and ``env/steps``. ``on_epoch`` functions get each epoch's flat stats
    (for progress output). ``callbacks`` (:class:`~rlloop.trainers.callbacks.Callback`) hear each
    epoch (``on_step``; ``False`` stops the run after it), each evaluation, each
    checkpoint written and the end of :meth:`run`, as in ``learn()``.
    """

    def __init__(self, task: Task[ModelT], model: ModelT, *, run_dir: str | Path | None = None,
                 resume: bool = False, sink: MetricsSink | None = None,
                 on_epoch: Sequence[Callable[[Stats], None]] = (),
                 callbacks: Sequence[Callback] = ()) -> None:
        """Raises ConfigError: an ``on_epoch`` entry that is not a function of the stats
        (a :class:`~rlloop.trainers.callbacks.Callback` goes in ``callbacks``), or a ``callbacks``
        entry that is not a ``Callback``."""
        for hook in on_epoch:
            if isinstance(hook, Callback) or not callable(hook):
                raise ConfigError(f"on_epoch takes functions of an epoch's stats, got {hook!r}"
                                  "; pass rlloop.Callback objects as callbacks=[...]")
        self._user = UserCallbacks(as_callbacks(callbacks))
        cfg = task.config
        torch.set_num_threads(cfg.torch_threads)
        self.task, self.model = task, model.to(task.device)  # before its optimiser exists
        self.optimizer = task.get_optimizer(model)
        self.skipped_updates = 0
        self.restarts = 0
        self.stop_requested: str | None = None
        self.save_requested = False
        self.on_epoch = list(on_epoch)
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.manager: CheckpointManager | None = None
        sinks = [as_sink(sink)] if sink is not None else []
        if self.run_dir is not None:
            check_members(self.run_dir)  # a planted link is refused before any write
            self.manager = CheckpointManager(self.run_dir / "checkpoints", cfg.keep_checkpoints)
            sinks.append(JsonlSink(self.run_dir / "metrics.jsonl"))
        self._sink = MultiSink(sinks)
        self._schedule = _EpochSchedule(self)
        self.trainer = Trainer(_TaskEvaluation(task, model), sink=self._sink,
                               schedule=self._schedule, callbacks=self._user.each())
        if resume:
            self._restore()
        else:  # sampling draws from the global generators; a resume restores them
            seed_global_rngs(cfg.seed)

    @property
    def state(self) -> dict[str, int]:
        return self.trainer.state

    # ---- the loop ------------------------------------------------------------------------
    def run(self, stop_conditions: Sequence[Condition] = ()) -> Stats:
        """Epochs until the step budget, a stop condition on an epoch's stats, or a signal.

        Always closes the worker pool and, once anything was trained, saves a final
        checkpoint (also on errors: what was learned is kept).
        """
        schedule = self._schedule

        def finish(status: str) -> None:
            if schedule.pool is not None:
                schedule.pool.close()
                schedule.pool = None
            if self.state["train/steps"] and self.manager is not None:
                self.save()
            self._sink.close(status)

        started = time.perf_counter()
        stopped_by = "budget"
        self._user.stopped_by = None  # a callback's stop ended the previous run() only
        with supervised(self, finish):
            schedule.pool = self.task.get_worker_pool()
            if not schedule.finished(self.trainer):
                self.trainer.run(stop_conditions=[
                    *stop_conditions, lambda _: self._user.stopped_by is not None])
                if not schedule.finished(self.trainer):
                    stopped_by = self._user.stopped_by or "stop condition"
        if self.stop_requested:
            stopped_by = f"signal {self.stop_requested}"
        self._user.train_end(self._result(time.perf_counter() - started, stopped_by))
        return schedule.last

    def _result(self, seconds: float, stopped_by: str) -> RunResult:
        """What :meth:`run` tells the callbacks' ``on_train_end`` (``run_dir``: the working
        directory when the trainer has none)."""
        from rlloop.trainers.result import RunResult

        return RunResult(self.run_dir or Path(), self.state["env/steps"], seconds, None,
                         dict(self._schedule.last), stopped_by)

    def epoch(self, pool: WorkerPool) -> Stats:
        """Collect one epoch, then train on it; returns the epoch's flat stats."""
        cfg = self.task.config
        index, steps_before = self.state["train/epochs"], self.state["train/steps"]
        rng_before = capture_rng_state()
        t0 = time.perf_counter()
        sampling = SamplingStats()
        restarts_before = pool.restarts
        try:
            trajectories = self.task.collect_samples(
                self.model, pool, cfg.num_epoch_samples,
                min_trajectory_length=cfg.min_trajectory_length,
                max_trajectory_length=cfg.max_trajectory_length,
                min_batch_size=cfg.min_batch_size, max_batch_size=cfg.max_batch_size,
                max_wait_time=cfg.max_wait_time, optimal=cfg.optimal, stats=sampling,
                should_stop=lambda: self.stop_requested is not None,
                # epoch 0 keeps the workers' own seeds (env_seed + slot)
                seeds=epoch_seeds(cfg.env_seed, index, pool.num_slots) if index else None)
        finally:
            self.restarts += pool.restarts - restarts_before
        t1 = time.perf_counter()
        if self.stop_requested:
            # A partial epoch is not trained on: the run stands where the epoch started,
            # and so does the final checkpoint (its resume collects this epoch afresh).
            restore_rng_state(rng_before)
            return {}
        try:
            losses = self._train_on(self.task.build_dataset(trajectories), index)
        finally:
            # Counted together, even when training stops inside the epoch (a budget, a
            # stop past stop_wait_s, an error): a resume then starts the next epoch.
            self.state["env/steps"] += sampling.samples
            self.state["train/epochs"] += 1
        if (save_due(self, cfg.checkpoint_every, self.state["train/steps"], steps_before)
                and self.manager is not None):  # (without a run_dir there is nowhere to save)
            self.save()
        t2 = time.perf_counter()
        stats: Stats = {**sampling.as_stats(), **_mean(losses),
                        "workers/restarts": float(self.restarts),
                        "guard/skipped_updates": float(self.skipped_updates),
                        "time/collect_s": t1 - t0, "time/learn_s": t2 - t1,
                        "env/steps_per_s": sampling.samples / max(t1 - t0, 1e-9)}
        self.trainer.log(self.trainer.count(stats))
        for callback in self.on_epoch:
            callback(stats)
        return stats

    def _train_on(self, dataset: TrajectoryDataset, index: int) -> list[dict[str, float]]:
        """The epoch's train steps: all of them, unless the step budget ends first or a
        stop signal has waited ``stop_wait_s`` for the epoch's end."""
        cfg = self.task.config
        if len(dataset) == 0:
            _log.warning("epoch %d collected no usable samples; nothing to train on",
                         self.state["train/epochs"])
            return []
        losses = []
        for batch in self._batches(dataset, index):
            with atomic():  # a second signal does not part an update from its count
                losses.append(self.train_step(batch))
                self.state["train/steps"] += 1
            if self.state["train/steps"] >= cfg.total_steps or self._stop_waited():
                break
        return losses

    def _stop_waited(self) -> bool:
        """A stop signal has waited ``stop_wait_s`` for the epoch's end (a scheduler's
        grace period must not run out before the final checkpoint)."""
        since = stop_requested_since()
        return (self.stop_requested is not None and since is not None
                and time.monotonic() - since >= self.task.config.stop_wait_s)

    def _batches(self, dataset: TrajectoryDataset, index: int) -> Iterator[Any]:
        """One pass over the dataset, or ``num_update_steps`` minibatches (cycling), in
        an order drawn from epoch ``index``'s own generator (on the host: torch's
        DataLoader wants a CPU one)."""
        generator = torch.Generator(device="cpu").manual_seed(
            epoch_seeds(self.task.config.seed, index, 1)[0])
        loader = self.task.get_dataloader(dataset, generator=generator)
        steps = self.task.config.num_update_steps
        device = self.task.device
        if steps is None:
            return (move_to(b, device) for b in host_iter(loader))
        passes = itertools.chain.from_iterable(host_iter(loader) for _ in itertools.count())
        return (move_to(b, device) for b in itertools.islice(passes, steps))

    def train_step(self, batch: Any) -> dict[str, float]:
        """One guarded gradient step: run_model -> compute_loss -> backward -> clip -> step."""
        if not all_finite(batch):
            return self._skip("observation, reward or target in the batch")
        output = self.task.run_model(self.model, batch)
        total, parts = _total_loss(self.task.compute_loss(self.model, batch, output))
        if not bool(torch.isfinite(total)):
            return self._skip("loss")
        self.optimizer.zero_grad(set_to_none=True)
        total.backward()  # type: ignore[no-untyped-call]
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        norm = grad_norm(params)
        if not bool(torch.isfinite(norm)):
            self.optimizer.zero_grad(set_to_none=True)
            return self._skip("gradient")
        clip_gradients(params, GradientClip(self.task.config.max_grad_norm), norm)
        self.optimizer.step()
        return {"losses/total": float(total.detach()), "learner/grad_norm": float(norm),
                **{f"losses/{k}": float(v) for k, v in parts.items()}}

    def _skip(self, what: str) -> dict[str, float]:
        self.skipped_updates += 1
        if self.task.config.on_nonfinite == "raise":
            raise NonFiniteError(
                f"non-finite {what} at train step {self.state['train/steps']} (epoch "
                f"{self.state['train/epochs']}, env step {self.state['env/steps']}); the update "
                "was not applied. Check the env's observations and rewards or lower the "
                "learning rate, or set on_nonfinite=skip")
        return {}

    # ---- checkpoints ---------------------------------------------------------------------
    def save(self) -> Path:
        """Write a checkpoint named by the train step (replacing one of the same step)."""
        if self.manager is None:
            raise RunDirError("this TaskTrainer has no run_dir; pass run_dir= to save checkpoints")
        components = {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "trainer": {"counters": dict(self.state), "skipped_updates": self.skipped_updates,
                        "restarts": self.restarts},
            "rng": capture_rng_state(),
        }
        metadata = {"task": type(self.task).__qualname__,
                    "config": dataclasses.asdict(self.task.config),
                    "train_steps": self.state["train/steps"]}
        path = self.manager.save(self.state["train/steps"], components, metadata=metadata)
        self._user.checkpoint(path)
        return path

    def _restore(self) -> None:
        if self.manager is None:
            raise RunDirError("resume=True needs run_dir=..., the directory to resume from")
        ckpt = self.manager.load_latest(expected_components=COMPONENTS)
        if ckpt is None:
            raise RunDirError(f"{self.run_dir} has no loadable task checkpoint to resume from; "
                              "start without resume")
        parts = ckpt.components
        self.model.load_state_dict(parts["model"])
        self.optimizer.load_state_dict(parts["optimizer"])
        trainer = parts["trainer"]
        self.trainer.state = {k: int(v) for k, v in trainer["counters"].items()}
        self.skipped_updates = int(trainer["skipped_updates"])
        self.restarts = int(trainer["restarts"])
        restore_rng_state(parts["rng"])


class _EpochSchedule:
    """The task's iteration on the one loop: one epoch (collect, then train steps)."""

    counters: tuple[str, ...] = ("train/steps", "train/epochs", "env/steps")
    stop_reason = "budget"

    def __init__(self, owner: TaskTrainer[Any]) -> None:
        self.owner = owner
        self.pool: WorkerPool | None = None
        self.last: Stats = {}  # the last whole epoch's stats

    def step(self, trainer: Trainer, env_config: dict[str, Any] | None) -> Stats:
        if self.pool is None:
            raise RuntimeError("TaskTrainer.run() opens the worker pool; call that")
        self.last = self.owner.epoch(self.pool) or self.last  # {}: stopped while collecting
        return self.last

    def start(self, trainer: Trainer, steps_per_eval: int | None,
              eval_env_config: dict[str, Any] | None) -> None:
        pass

    def eval_due(self, trainer: Trainer) -> bool:
        return False

    def evaluate(self, trainer: Trainer, eval_env_config: dict[str, Any] | None) -> Stats:
        return trainer.eval(env_config=eval_env_config)

    def finished(self, trainer: Trainer) -> bool:
        """The step budget is spent, or a signal asked to stop."""
        return (trainer.state["train/steps"] >= self.owner.task.config.total_steps
                or self.owner.stop_requested is not None)

    def get_state(self) -> dict[str, Any]:
        return {}

    def set_state(self, state: Mapping[str, Any]) -> None:
        pass


class _TaskEvaluation:
    """``Trainer.eval`` for a task: whole episodes of its own env."""

    horizons_per_env_reset = -1  # the workers own their envs' resets
    evals = 0  # (a task's eval episodes are seeded by its config alone)

    def __init__(self, task: Task[Any], model: nn.Module) -> None:
        self.task, self.model = task, model

    def evaluate(self, episodes: int, env_config: dict[str, Any] | None = None,
                 deterministic: bool = True) -> Stats:
        return self.task.evaluate(self.model, episodes, optimal=deterministic)


def epoch_seeds(seed: int, epoch: int, count: int) -> list[int]:
    """``count`` 32-bit seeds of epoch ``epoch`` of a run seeded ``seed``: the same for the
    same arguments in any process, apart from other epochs' and from small consecutive
    seeds (the workers' own)."""
    return [derive_seed(seed, f"task-epoch-{epoch}-{i}") % 2**32 for i in range(count)]


def all_finite(value: Any) -> bool:
    """True if every float tensor or array inside ``value`` (dataclasses, mappings and
    sequences are searched) is free of NaN and infinity."""
    if isinstance(value, Tensor):
        return not value.is_floating_point() or bool(torch.isfinite(value).all())
    if isinstance(value, np.ndarray | np.floating | float):
        return bool(np.isfinite(value).all()) if np.issubdtype(np.asarray(value).dtype,
                                                               np.floating) else True
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return all(all_finite(getattr(value, f.name)) for f in dataclasses.fields(value))
    if isinstance(value, Mapping):
        return all(all_finite(v) for v in value.values())
    if isinstance(value, list | tuple):
        return all(all_finite(v) for v in value)
    return True


def _total_loss(loss: Tensor | Mapping[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
    if isinstance(loss, Tensor):
        return loss, {}
    parts = dict(loss)
    if not parts:
        raise ValueError("compute_loss returned an empty mapping; return at least one loss")
    total = torch.stack([v.reshape(()) for v in parts.values()]).sum()
    return total, {k: v.detach() for k, v in parts.items()}


def _mean(rows: Sequence[Mapping[str, float]]) -> dict[str, float]:
    keys: dict[str, list[float]] = {}
    for row in rows:
        for k, v in row.items():
            keys.setdefault(k, []).append(v)
    return {k: float(np.mean(v)) for k, v in keys.items()}
