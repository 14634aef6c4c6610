"""A training run on disk: run directory, sinks, checkpoints, signals, resume.

This is the composition root the CLI calls. The :class:`~rlloop.trainers.loop.Trainer`
knows nothing about files; everything that writes the run directory lives here (reading a
finished run back is :mod:`rlloop.runs.saved`).

Run directory layout::

    <run>/.lock              the PID of the one process training the run (it flocks the
                             run directory and this file)
    <run>/config.yaml        the full resolved config
    <run>/run.json           run identity (MLflow run id, algo, env)
    <run>/metrics.jsonl      one JSON object per logged step
    <run>/checkpoints/<env steps>/   periodic checkpoints (last N kept) + the final one;
                             named by optimisation steps for off-policy algorithms
    <run>/best/              checkpoint with the best eval return so far
    <run>/mlflow.db          the embedded MLflow store (``mlflow ui`` reads it)
    <run>/video.mp4          one episode of the best policy (``save_video``)
    <run>/report.md, report.html, summary.json, *.png   the end-of-run report and figures
    <run>/policy.onnx, policy.pt   written by ``rlloop export``
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import math
import re
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch
import yaml

from rlloop.config.registry import ALGORITHMS
from rlloop.runs.build import COMPONENTS, build_algorithm
from rlloop.trainers.callbacks import Callback, UserCallbacks
from rlloop.checkpoint.format import rlloop_version
from rlloop.checkpoint import (
    Checkpoint,
    CheckpointError,
    CheckpointManager,
    capture_rng_state,
    load_checkpoint,
    restore_rng_state,
    save_replacing,
)
from rlloop.trainers.stop_conditions import Condition, HitsUpperBound
from rlloop.config.run_config import (
    SKIPPED_SHARE_RECORDS,
    RunConfig,
    build_config,
    load_yaml,
    parse_set,
    resumable,
)
from rlloop.runs.disk_full import checkpoint_bytes, disk_full_cause, disk_full_error
from rlloop.envs.imports import check_saved_endpoints, saved_endpoints
from rlloop.envs.registry import env_spec
from rlloop.errors import ConfigError, RunDirError, SavedStateError, saved_count
from rlloop.learners.distributed import LearnerGroupError
from rlloop.learners.learner import Learner, NonFiniteError
from rlloop.logging import ConsoleSink, JsonlSink, MultiSink, ProcessSink, Sink
from rlloop.logging.process_sink import has_spare
from rlloop.system.numerics import flushed_denormals
from rlloop.trainers.offpolicy_schedule import BorderSchedule, OffPolicyAlgorithm
from rlloop.system.profiling import TraceProfiler
from rlloop.runs.report import FIGURE_PRELOAD, FigureWriter, read_metrics, write_figures, write_report
from rlloop.runs.lock import RunLock, ensure_free
from rlloop.system.run_files import MEMBERS, check_members, check_run_dir, refuse_study_dir, write_file
from rlloop.runs.saved import (
    acting_config,
    check_finite_policy,
    evaluate_run,
    load_policy,
    load_run_config,
    load_run_policy,
    policy_checkpoint,
)
from rlloop.system.signals import StopInterrupted, save_due, supervised, terminate_as_interrupt
from rlloop.runs.timing import PhaseTimes, TimedSink
from rlloop.trainers.loop import Stats, Trainer
from rlloop.trainers.result import RunResult
from rlloop.config.unused_settings import run_warnings, unused_settings

#: ``rlloop.runs.session`` is the entry point users import from: building an algorithm
#: (:mod:`rlloop.runs.build`) and reading a saved run (:mod:`rlloop.runs.saved`) are here too.
__all__ = ["COMPONENTS", "RunResult", "Session", "acting_config", "build_algorithm",
           "default_run_dir", "evaluate_run", "load_policy", "load_run_config",
           "load_run_policy", "policy_checkpoint", "resume", "resume_config",
           "solve_threshold", "train"]

_log = logging.getLogger(__name__)


def default_run_dir(config: RunConfig) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    # One path component whatever the id holds ("ale_py:ALE/Pong-v5" -> ale_py-ALE-Pong-v5).
    env = re.sub(r"[^\w.-]+", "-", config.env)
    return Path("runs") / f"{config.algo}-{env}-{stamp}"


def claim_default_run_dir(config: RunConfig) -> Path:
    """:func:`default_run_dir`, created here so that no other run takes it: runs started
    in the same second (two seeds launched together) get ``-2``, ``-3``, ... suffixes."""
    base = default_run_dir(config)
    for k in itertools.count(1):
        path = base if k == 1 else base.with_name(f"{base.name}-{k}")
        try:
            path.mkdir(parents=True)
        except FileExistsError:
            continue
        return path
    raise AssertionError("unreachable")


@contextlib.contextmanager
def claimed_default_run_dir(config: RunConfig) -> Iterator[Path]:
    """:func:`claim_default_run_dir` for the block; when the block raises, the directory
    (and ``runs/`` if this made it) is removed if still empty: the run never started."""
    made = [p for p in reversed(default_run_dir(config).parents) if not p.exists()]
    path = claim_default_run_dir(config)
    try:
        yield path
    except BaseException:
        for p in (path, *reversed(made)):
            with contextlib.suppress(OSError):
                p.rmdir()
        raise


def solve_threshold(config: RunConfig) -> float | None:
    if config.solve_threshold is not None:
        return config.solve_threshold
    return env_spec(config.env, config.backend, env_kwargs=config.env_kwargs).reward_threshold


class _Checkpoints:
    """Trainer callback: periodic, on-request (SIGUSR1) and best-so-far checkpoints."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def on_step(self, trainer: Trainer, stats: Stats) -> None:
        due = save_due(self.session, self.session.checkpoint_every,
                       trainer.state["algorithm/steps"])
        # (a settled iteration: the cut run's checkpoint of this step still owes its eval)
        if due or trainer.settled:
            self.session.save()

    def on_eval(self, trainer: Trainer, stats: Stats) -> None:
        self.session.phases.add("evals", stats.get("time/eval_s", 0.0))
        value = stats.get("eval/return_mean", math.nan)
        self.session.latest_eval_at = trainer.state["env/steps"]
        best = self.session.best_eval_return
        if not math.isnan(value) and (best is None or value > best):
            # A policy snapshot: no replay buffer or optimiser state (GBs for big buffers).
            snapshot = self.session.components(policy=True)
            snapshot["trainer"]["best_eval_return"] = value
            with self.session.phases.timed("checkpoints"):
                save_replacing(self.session.run_dir / "best", snapshot,
                               metadata=self.session.metadata(), replace_incomplete=True)
            # The run's best once saved: a save cut by a second stop signal leaves the old
            # best in the final checkpoint, so the resume's replay of this eval saves it.
            self.session.best_eval_return = value
            self.session.new_best = True
        # Here, not in a stop condition: its evaluation then comes before the iteration's
        # checkpoint, which must count it (the eval count seeds the next evaluation).
        self.session.check_solved(value)


class _SkippedUpdates:
    """Trainer callback: with ``on_nonfinite=skip``, a warning when updates are first
    skipped for a NaN/inf, and :class:`NonFiniteError` once more than ``max_skipped_share``
    of them were skipped, averaged over ``SKIPPED_SHARE_RECORDS`` records in a row: a run
    whose env yields NaN every step skipped every update and still ended as a success.

    A record is a step whose stats report ``guard/skipped_updates`` (each iteration's;
    border's every record_interval): the counters are read there, so an off-policy update
    still never waits for the device.
    """

    def __init__(self, config: RunConfig, learner: Learner[Any]) -> None:
        self.active = config.on_nonfinite == "skip"  # (raise stops at the first skip)
        self.limit = config.max_skipped_share
        self.learner = learner
        #: The share of its updates each of the latest records skipped.
        self.shares: deque[float] = deque(maxlen=SKIPPED_SHARE_RECORDS)
        self.warned = False
        self.counts = (0, 0)  # tried and skipped updates at the latest record

    def start(self) -> None:
        """Count from the learner's counters as they are now (a resumed run's restored)."""
        self.counts = (self.learner.tried_updates, self.learner.skipped_updates)
        self.shares.clear()

    def on_step(self, trainer: Trainer, stats: Stats) -> None:
        if not self.active or "guard/skipped_updates" not in stats:
            return
        tried, skipped = self.learner.tried_updates, self.learner.skipped_updates
        new_tried, new_skipped = tried - self.counts[0], skipped - self.counts[1]
        self.counts = (tried, skipped)
        if new_tried <= 0:
            return  # no update since the latest record
        self.shares.append(new_skipped / new_tried)
        if new_skipped and not self.warned:
            self.warned = True
            then = ("the run goes on (max_skipped_share=1)" if self.limit >= 1 else
                    f"the run stops if more than {self.limit:.0%} of its updates are skipped "
                    f"over {SKIPPED_SHARE_RECORDS} records in a row (max_skipped_share)")
            _log.warning("updates are being skipped: %d of %d up to env step %s had a "
                         "NaN/inf in the batch, loss or gradient (guard/skipped_updates); "
                         "%s", new_skipped, new_tried,
                         f"{trainer.state['env/steps']:,}", then)
        if len(self.shares) == SKIPPED_SHARE_RECORDS:
            self.judge(trainer)

    def on_eval(self, trainer: Trainer, stats: Stats) -> None:
        pass

    def judge(self, trainer: Trainer) -> None:
        """Raise :class:`NonFiniteError` if the latest records skipped more than the limit
        (the end of a run shorter than the window judges all of its records)."""
        if not self.active or not self.shares:
            return
        share = sum(self.shares) / len(self.shares)
        if share > self.limit:
            raise NonFiniteError(
                f"{share:.0%} of the updates of the last {len(self.shares)} metrics records "
                f"(to env step {trainer.state['env/steps']:,}) were skipped for a NaN/inf in "
                f"the batch, loss or gradient, more than max_skipped_share={self.limit:g}: "
                "the run is not learning. Check the env's observations and rewards (and "
                "env_kwargs) or lower the learning rate, or raise max_skipped_share (1: "
                "never stop)")


class Session:
    """One run directory with its algorithm, trainer, sinks and checkpoint manager.

    It holds the run directory's lock (:class:`~rlloop.runs.lock.RunLock`) from before its
    first write until `run` returns; a second trainer of the same directory is refused.
    """

    def __init__(self, config: RunConfig, run_dir: Path, *, resume: bool = False,
                 console: Any = None, callbacks: Sequence[Callback] = (),
                 started_at: float | None = None) -> None:
        #: Seconds per phase of the whole run (``time/<phase>_s`` in its last metrics row).
        self.phases = PhaseTimes(started_at)
        self.lock = RunLock(run_dir)
        self.user_callbacks = UserCallbacks(callbacks)
        try:
            self._open(config, run_dir, resume=resume, console=console)
        except BaseException as e:
            try:
                self._raise_if_disk_full(e)
                raise
            finally:
                self.lock.release()
                if hasattr(self, "algorithm"):
                    self.algorithm.close()

    def _open(self, config: RunConfig, run_dir: Path, *, resume: bool, console: Any) -> None:
        self.config = config
        self.run_dir = run_dir
        self.best_eval_return: float | None = None
        self.save_requested = False
        self.stop_requested: str | None = None
        self.solved = False
        self.solved_at: int | None = None  # env steps of the evaluation confirmed solved
        self.resumed_owing = False  # restored from a checkpoint that owes an evaluation
        self._training = False  # inside the training loop (evals there may solve the run)
        self._solve_threshold: float | None = None  # known when the loop starts
        check_members(run_dir)
        _check_tracking_store(config)
        for line in unused_settings(config.hparams):
            _log.warning(line)
        torch.set_num_threads(config.torch_threads)
        self.algorithm = build_algorithm(config)
        for line in run_warnings(config):  # once the settings all fit
            _log.warning(line)
        if config.num_learners > 1:
            from rlloop.algorithms.distributed import start_learners

            start_learners(self.algorithm, config)  # the other learner ranks
        self.lock.acquire()  # before the first write; it creates run_dir
        if not resume:
            _refuse_existing_run(run_dir)  # again: another trainer may have just finished it
        write_file(run_dir / "config.yaml", yaml.safe_dump(config.to_dict(), sort_keys=False))
        self.manager = CheckpointManager(run_dir / "checkpoints", keep_last=config.keep_checkpoints)
        identity = _read_json(run_dir / "run.json") if resume else {}
        self.console = ConsoleSink(config.planned_env_steps, console=console,
                                   enabled=config.progress)
        self.jsonl = JsonlSink(run_dir / "metrics.jsonl")
        sinks: list[Sink] = [self.jsonl, self.console]
        self.identity = {"algo": config.algo, "env": config.env,
                         "mlflow_run_id": identity.get("mlflow_run_id")}
        self.mlflow: ProcessSink | None = None
        self.mlflow_uri: str | None = None
        if config.mlflow:
            from rlloop.logging.mlflow_sink import PRELOAD, MlflowSink, sqlite_tracking_uri

            # In a child process: importing MLflow and writing to its store is seconds of
            # pure-Python work that would otherwise stall the training loop. Every row
            # reaches it (batched); only a store that stops answering loses rows, and
            # `close` then waits a bounded time and says how many.
            uri = config.mlflow_tracking_uri or sqlite_tracking_uri(run_dir / "mlflow.db")
            self.mlflow_uri = uri
            self.mlflow = ProcessSink(MlflowSink, label=f"MLflow store {uri}",
                                      batch_interval_s=config.mlflow_interval_s,
                                      close_timeout_s=config.mlflow_close_timeout_s,
                                      tracking_uri=uri, experiment_name=config.experiment,
                                      run_name=run_dir.name,
                                      run_id=self.identity["mlflow_run_id"], preload=PRELOAD,
                                      tags={"algo": config.algo, "env": config.env,
                                            "seed": config.seed,
                                            "rlloop_version": rlloop_version()},
                                      source_dir=str(Path.cwd()))
            sinks.append(self.mlflow)
        if config.tensorboard:
            from rlloop.logging import TensorBoardSink

            sinks.append(TensorBoardSink(run_dir / "tensorboard"))
        self.wandb = self._wandb_sink(identity.get("wandb_run_id"))
        if self.wandb is not None:
            sinks.append(self.wandb)
        self.sink = TimedSink(MultiSink(sinks), self.phases)
        self._sinks_closed = False
        self.new_best = False  # this sitting saved a better policy to best/
        self.latest_eval_at: int | None = None  # env steps of trainer.latest_eval
        if not resume:
            self.sink.log_params(config.to_dict())
        _write_json(run_dir / "run.json", self.identity)
        # Off-policy algorithms run on border's cadence: evals and saves counted in
        # optimisation steps (their config section), checkpoints named by them.
        self.off_policy = ALGORITHMS[config.algo].kind == "off_policy"
        self.checkpoint_every = 0 if self.off_policy else config.checkpoint_every
        schedule = (BorderSchedule(cast(OffPolicyAlgorithm, self.algorithm),
                                   save=lambda _: self.save())
                    if self.off_policy else None)
        self.profiler: TraceProfiler | None = None
        if config.profile is not None:
            self.profiler = TraceProfiler(config.profile, run_dir / "profile")
            self.profiler.label(self.algorithm, ALGORITHMS[config.algo].kind)
        # Last: it may stop the run, after the others have heard the step.
        self.skipped_updates = _SkippedUpdates(config, self.algorithm.learner)
        self.trainer = Trainer(self.algorithm, sink=self.sink, eval_episodes=config.eval_episodes,
                               callbacks=[_Checkpoints(self), *self.user_callbacks.each(),
                                          *([self.profiler] if self.profiler else []),
                                          self.skipped_updates],
                               schedule=schedule)
        self.trainer.stop_early = self._stop_now
        if resume:
            self._restore()
        # The report's figures in the child the CLI started ahead (see FigureWriter). A
        # library caller (a notebook, a sweep of runs in one process) has none: it draws
        # them in-process, importing matplotlib once for all its runs.
        self.figure_writer: ProcessSink | None = None
        if has_spare(FIGURE_PRELOAD):
            self.figure_writer = ProcessSink(FigureWriter, label="report figures",
                                             preload=FIGURE_PRELOAD,
                                             run_dir=str(run_dir.resolve()))

    def _wandb_sink(self, run_id: str | None) -> ProcessSink | None:
        """W&B in a child process (like MLflow): importing it and starting its service take
        seconds; offline by default (see `rlloop.logging.wandb_sink`)."""
        config = self.config
        if not config.wandb:
            return None
        from rlloop.logging.wandb_sink import WandbSink

        if run_id is not None:
            self.identity["wandb_run_id"] = run_id
        return ProcessSink(WandbSink, label="W&B run", batch_interval_s=config.mlflow_interval_s,
                           close_timeout_s=config.mlflow_close_timeout_s,
                           run_dir=str(self.run_dir.resolve()), project=config.wandb_project,
                           name=self.run_dir.name, run_id=run_id)

    def _close_sinks(self, status: str) -> None:
        if self._sinks_closed:
            return
        self._sinks_closed = True
        if self.figure_writer is not None and status != "FINISHED":
            with contextlib.suppress(RuntimeError):  # it draws nothing then
                self.figure_writer.close(status)
        self.sink.close(status)
        self._record_ids()

    def _record_ids(self) -> None:
        """Write into run.json the MLflow and W&B run ids their children reported, once
        known: a resume continues those runs, even after this process was killed."""
        ids = {key: sink.info["run_id"] for key, sink in (("mlflow_run_id", self.mlflow),
                                                          ("wandb_run_id", self.wandb))
               if sink is not None and sink.info.get("run_id")}
        if any(self.identity.get(key) != value for key, value in ids.items()):
            self.identity.update(ids)
            _write_json(self.run_dir / "run.json", self.identity)

    # ---- checkpoint contents -----------------------------------------------------------
    def components(self, policy: bool = False) -> dict[str, Any]:
        algorithm = self.algorithm.get_policy_state() if policy else self.algorithm.get_state()
        return {"algorithm": algorithm,
                "trainer": {**self.trainer.get_state(), "best_eval_return": self.best_eval_return,
                            "latest_eval_at": self.latest_eval_at, "solved_at": self.solved_at},
                "rng": capture_rng_state()}

    def metadata(self) -> dict[str, Any]:
        return {"config": self.config.to_dict(), "env_steps": self.trainer.state["env/steps"],
                "algo": self.config.algo, "env": self.config.env,
                "device": str(self.algorithm.device)}

    def save(self, components: dict[str, Any] | None = None) -> Path:
        counter = "algorithm/steps" if self.off_policy else "env/steps"
        with self.phases.timed("checkpoints"):
            path = self.manager.save(self.trainer.state[counter],
                                     components or self.components(), metadata=self.metadata())
            self._record_ids()  # what a resume from this checkpoint continues
        self.user_callbacks.checkpoint(path)
        return path

    def _restore(self) -> None:
        """Continue from the newest checkpoint this run can take: one that fails its checks
        (damaged files, or values unfit for the built run) is skipped with a warning, and
        the next older one is restored over what it set."""
        ckpt = self.manager.load_latest(expected_components=COMPONENTS,
                                        restore=self._restore_from)
        if ckpt is None:
            raise _no_checkpoint(self.run_dir)
        # Rows a crashed run logged after this checkpoint: the resumed run logs them anew.
        state = self.trainer.state
        self.jsonl.drop_rows_after(state["env/steps"], ("opt/steps", state["algorithm/steps"])
                                   if self.off_policy else None)

    def _restore_from(self, ckpt: Checkpoint) -> None:
        """Restore ``ckpt`` (a value the built run cannot take raises: see `_restore`)."""
        self.algorithm.set_state(ckpt.components["algorithm"])
        check_finite_policy(self.algorithm)
        self.trainer.set_state(ckpt.components["trainer"])
        # best/ may hold a better policy than this checkpoint knows of (one found after it
        # by a run that then crashed): a resumed run must not replace it with a worse one.
        saved = ckpt.components["trainer"]
        returns = [r for r in (_saved_return(saved.get("best_eval_return")),
                               saved_best_return(self.run_dir / "best")) if r is not None]
        self.best_eval_return = max(returns) if returns else None
        # It owes an evaluation (or its callbacks, or border's cadence): what the settle
        # makes of it (made, heard, or failed and counted) must be saved even if this
        # sitting takes no step, or every resume would start from the same debt.
        self.resumed_owing = self.trainer.owes()
        self.latest_eval_at = _saved_step(saved.get("latest_eval_at"), "latest_eval_at")
        # Solved by this checkpoint's evaluation, cut in a later callback: the resume
        # hands that evaluation to the rest of them, then stops as the cut run would have.
        # (A run stopped solved and resumed trains on, and is judged anew.)
        self.solved = (self.config.stop_on_solve and saved.get("eval_unheard") is not None
                       and _saved_step(saved.get("solved_at"), "solved_at")
                       == self.trainer.state["env/steps"])
        restore_rng_state(ckpt.components["rng"])

    # ---- the run -------------------------------------------------------------------------
    def stop_conditions(self) -> list[Condition]:
        return [HitsUpperBound("env/steps", self.config.total_env_steps),
                lambda _: self._stop_now()]

    def _stop_now(self) -> bool:
        """A stop signal, a callback's stop, or a solve (set only under stop_on_solve)."""
        return (self.stop_requested is not None or self.user_callbacks.stopped_by is not None
                or self.solved)

    def _eval_greedy(self) -> bool:
        """Whether the run's evaluations act greedily (the off-policy `evaluator` setting,
        border's; always for the others): the final and the confirming ones as well."""
        evaluator = getattr(self.trainer.schedule, "evaluator", None)
        return bool(getattr(evaluator, "deterministic", True))

    def check_solved(self, eval_return: float) -> None:
        """Mark the run :attr:`solved` when an evaluation while training reaches the solve
        threshold (``stop_on_solve``), confirmed by :meth:`_confirm_solved`."""
        threshold = self._solve_threshold
        if (self._training and self.config.stop_on_solve and threshold is not None
                and not self.solved and not self.stop_requested
                # the budget ends the run anyway: no confirming evaluation
                and self.trainer.state["env/steps"] < self.config.total_env_steps
                and not math.isnan(eval_return) and eval_return >= threshold):
            self._confirm_solved(threshold)

    def _confirm_solved(self, threshold: float) -> None:
        """Solved only if a fresh evaluation over ``solve_episodes`` episodes reaches the
        threshold too: the mean of a few episodes can be lucky (PPO on Acrobot-v1 once
        "solved" at -79.8 right after evaluations of -500 and -295)."""
        cfg = self.config
        if cfg.solve_episodes > cfg.eval_episodes:
            with self.phases.timed("evals"), flushed_denormals(self.trainer.flush_denormal):
                result = self.algorithm.evaluate(cfg.solve_episodes, None,
                                                 self._eval_greedy())
            value = float(result["return_mean"])
            self.sink.log_metrics({"eval/solve_return_mean": value,
                                   "eval/solve_episodes": float(result["episodes"])},
                                  self.trainer.state["env/steps"])
            if value < threshold:
                return
        self.solved, self.solved_at = True, self.trainer.state["env/steps"]

    def run(self) -> RunResult:
        """Train until a stop condition; always writes a final checkpoint and the report.

        Raises :class:`~rlloop.errors.DiskFullError` (one line) when the disk fills up.
        """
        try:
            with terminate_as_interrupt():
                return self._run()
        except Exception as e:
            self._raise_if_disk_full(e)
            raise
        finally:
            self.lock.release()

    def _raise_if_disk_full(self, exc: BaseException) -> None:
        cause = disk_full_cause(exc)
        if cause is None:
            return
        need = checkpoint_bytes([p for p in (self._latest(), self.run_dir / "best") if p],
                                getattr(self, "algorithm", None))
        hint = (f"continue with `rlloop train {self.config.algo} --resume {self.run_dir}`"
                if (self.run_dir / "config.yaml").is_file() else "start the run again")
        raise disk_full_error(cause, self.run_dir, need, hint) from exc

    def _latest(self) -> Path | None:
        return self.manager.latest() if hasattr(self, "manager") else None

    def _run(self) -> RunResult:
        try:
            result = self._train_and_report()
        finally:
            with _quiet(disk_full_cause(sys.exception()) is not None):
                self._close_sinks("FAILED" if sys.exception() else "FINISHED")
        result.mlflow_ui = self._mlflow_ui()  # known once the MLflow child has answered
        self.user_callbacks.train_end(result)
        return result

    def _train_and_report(self) -> RunResult:
        trainer, cfg = self.trainer, self.config
        stats: Stats = {}
        self.phases.add("startup", self.phases.elapsed())
        self._start_steps = trainer.state["env/steps"]
        self.skipped_updates.start()
        self._final: dict[str, Any] | None = None
        with supervised(self, self._finish), self._profiling():
            try:
                # A spent budget, or a schedule that has ended (border's max_opts), trains
                # nothing more on a resume.
                if (trainer.state["env/steps"] < cfg.total_env_steps
                        and not trainer.schedule.finished(trainer)):
                    every = None if self.off_policy else cfg.eval_every or None
                    self._solve_threshold = solve_threshold(cfg)
                    self._training = True
                    try:
                        stats = trainer.run(steps_per_eval=every,
                                            stop_conditions=self.stop_conditions())
                    finally:
                        self._training = False
                    if not self.stop_requested:  # (a stop signal asks for a quick exit)
                        self.skipped_updates.judge(trainer)
                else:  # a run cut at its budget's end: the eval (record, save) it owes
                    stats = trainer.settle()
                if (self.latest_eval_at == trainer.state["env/steps"]
                        and "eval/return_mean" in trainer.latest_eval):
                    # A resume of a finished run: its last evaluation stands (another
                    # would log a second row at the same step).
                    stats = {**stats, **trainer.latest_eval}
                if "eval/return_mean" not in stats and not trainer.eval_allowed():
                    # horizons_per_env_reset=k: a budget that ends between two k-collect
                    # boundaries, where no evaluation may run, leaves the last one standing
                    # (or none).
                    stats = {**stats, **trainer.latest_eval}
                elif "eval/return_mean" not in stats:
                    # The final checkpoint holds the state as training left it: this extra
                    # evaluation advances eval seeds (and any global RNG the env draws
                    # from), which a run trained straight through never does.
                    self._final = self.components()
                    stats = {**stats, **trainer.eval(deterministic=self._eval_greedy())}
                    self._final["trainer"].update(latest_eval=dict(trainer.latest_eval),
                                                  best_eval_return=self.best_eval_return,
                                                  latest_eval_at=self.latest_eval_at)
            except StopInterrupted:
                # An env worker did not answer within seconds of a stop signal: stop
                # without the iteration in flight (its experience is dropped).
                stats = dict(trainer.latest_eval)
        # Training is over: the progress display ends here, not after the video and report
        # (the phase rows below go to the records only).
        self.console.close("FINISHED")
        self.console.enabled = False
        # The video (its frames, then ffmpeg encoding in its own process) is made in a
        # thread while this one draws the report's figures: the two overlap.
        filming = None
        if cfg.save_video and not self.stop_requested:  # a stop signal wants a quick exit
            filming = _in_thread(self._film)
        elif cfg.save_video and self.new_best:
            self._drop_stale_video()
        steps = trainer.state["env/steps"]
        with self.phases.timed("report"):
            figures = self._figures()
        video = filming() if filming is not None else None
        self._log_phases(self.phases.stats(), steps)  # before the report, which shows it
        # The sitting's wall time, start-up included (the console summary's is the same
        # clock, read once the report is written too).
        result = RunResult(self.run_dir, steps, self.phases.elapsed(),
                           self.best_eval_return, stats, self._stopped_by(stats))
        with self.phases.timed("report"):
            write_report(self.run_dir, result, cfg, figures=figures,
                         phases_logged=not self._sinks_closed)
        self._log_phases({"time/report_s": self.phases.seconds["report"]}, steps)
        if self.mlflow is not None and not self._sinks_closed:
            self.mlflow.log_artifacts(self._artifacts(video))
        return result

    def _figures(self) -> list[str]:
        """Draw the report's figures (in the figure child when there is one); their names."""
        if self.figure_writer is not None:
            try:
                self.figure_writer.close("FINISHED")  # it draws them now, on another core
                names = self.figure_writer.info.get("figures")
                if isinstance(names, list):
                    return [str(name) for name in names]
            except RuntimeError as e:  # e.g. it could not import matplotlib's backend
                _log.warning("report figures: %s; drawing them in this process", e)
        return write_figures(self.run_dir, read_metrics(self.run_dir / "metrics.jsonl"))

    def _log_phases(self, times: dict[str, float], steps: int) -> None:
        if not self._sinks_closed:  # closed already when a signal stopped the run
            self.sink.log_metrics(times, steps)

    def _drop_stale_video(self) -> None:
        """A stop skipped filming after this sitting saved a new best policy: an earlier
        sitting's video.mp4 shows an older one, so it goes."""
        video = self.run_dir / "video.mp4"
        if video.is_file() and not video.is_symlink():
            video.unlink()
            _log.warning("removed video.mp4 (it showed an earlier best policy; the stop "
                         "skipped filming): `rlloop eval %s --video %s` films the new one",
                         self.run_dir, video)

    def _film(self) -> Path | None:
        from rlloop.runs.video import save_run_video

        with self.phases.timed("video"):
            return save_run_video(self.run_dir)

    def _artifacts(self, video: Path | None) -> dict[str, str]:
        """The run's files for its MLflow run (``{path: artifact folder}``): the model
        (``config.yaml`` + ``best/``, what `rlloop.load` reads), the video, the report, its
        figures and data."""
        files = {str(self.run_dir / n): "report" for n in
                 ("report.md", "report.html", "summary.json", "metrics.jsonl")}
        files.update({str(p): "report" for p in sorted(self.run_dir.glob("*.png"))
                      if not p.is_symlink()})  # a planted link would upload its target
        if video is not None:
            files[str(video)] = ""
        if (self.run_dir / "best").is_dir():
            files[str(self.run_dir / "config.yaml")] = "model"
            files[str(self.run_dir / "best")] = "model/best"
        return files

    @contextmanager
    def _profiling(self) -> Iterator[None]:
        """torch.profiler around the training loop and its final evaluation (``--profile``)."""
        if self.profiler is None:
            yield
            return
        self.profiler.start()
        try:
            yield
        finally:
            self.profiler.stop()

    def _finish(self, status: str) -> None:
        """The final checkpoint (whatever ended the run), then the sinks and envs."""
        try:
            # Steps taken (off-policy ones too, before any optimisation step), or a new run;
            # not after a learner rank died: its update may be half applied on rank 0.
            broken = isinstance(sys.exception(), LearnerGroupError)
            if not broken and (self.trainer.state["env/steps"] > self._start_steps
                               or self.resumed_owing or not self.manager.latest()):
                self.save(self._final)
        finally:
            if status != "FINISHED" or sys.exception() is not None:
                # A full disk fails the sinks too (MLflow's store); the one error line says it.
                with _quiet(disk_full_cause(sys.exception()) is not None):
                    self._close_sinks(status)
            # Else they stay open for the video, report and artifacts (closed in `_run`).
            self.algorithm.close()

    def _mlflow_ui(self) -> str | None:
        if self.mlflow is None or self.mlflow_uri is None or not self.mlflow.info.get("run_id"):
            return None  # never reached its store: naming it would point at nothing
        from rlloop.logging.mlflow_sink import ui_hint

        return ui_hint(self.mlflow_uri)

    def _stopped_by(self, stats: Stats) -> str:
        if self.stop_requested:
            return f"signal {self.stop_requested}"
        if self.user_callbacks.stopped_by:
            return self.user_callbacks.stopped_by
        if self.solved:
            return "solved"
        return "max_opts" if self.trainer.schedule.finished(self.trainer) else "budget"


def train(config: RunConfig, run_dir: str | Path | None = None, *,
          console: Any = None, callbacks: Sequence[Callback] = (),
          started_at: float | None = None) -> RunResult:
    """Start a new run in ``run_dir`` (default ``runs/<algo>-<env>-<time>``).

    ``started_at`` (``time.time()``, default now) is when start-up began (``time/startup_s``),
    e.g. the process's start for the CLI."""
    if not run_dir:
        with claimed_default_run_dir(config) as path:
            return _run_session(config, path, resume=False, console=console,
                                callbacks=callbacks, started_at=started_at)
    path = Path(run_dir)
    refuse_study_dir(path)
    if (path / "config.yaml").exists():
        ensure_free(path)  # a live trainer holds it: name its PID instead
        if not has_checkpoint(path):  # then "resume it" would only send the user back here
            raise _no_checkpoint(path)
    _refuse_existing_run(path, other_files=True)
    return _run_session(config, path, resume=False, console=console, callbacks=callbacks,
                        started_at=started_at)


def _run_session(config: RunConfig, path: Path, *, resume: bool, console: Any,
                 callbacks: Sequence[Callback], started_at: float | None) -> RunResult:
    """A session; when its learner group breaks, again from the newest checkpoint, up to
    ``max_learner_restarts`` times."""
    restarts = 0
    while True:
        try:
            return Session(config, path, resume=resume, console=console,
                           callbacks=callbacks, started_at=started_at).run()
        except LearnerGroupError as e:
            if restarts >= config.max_learner_restarts or not has_checkpoint(path):
                raise
            restarts += 1
            resume = True
            _log.warning("%s; restarting the learners from the newest checkpoint (restart "
                         "%d of %d)", str(e).split(";")[0], restarts,
                         config.max_learner_restarts)


def saved_best_return(best: Path) -> float | None:
    """The eval return a ``best/`` policy checkpoint was saved for; None when there is no
    intact one."""
    if not best.exists():
        return None
    try:
        trainer = load_checkpoint(best).components.get("trainer") or {}
        return _saved_return(trainer.get("best_eval_return"))
    except (CheckpointError, SavedStateError, AttributeError):  # (AttributeError: not a dict)
        return None


def _saved_return(value: Any) -> float | None:
    """A saved best eval return: None, or a finite number (``SavedStateError`` if not)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise SavedStateError(f"trainer.best_eval_return is {value!r:.40}, not a return")
    return float(value)


def _saved_step(value: Any, name: str) -> int | None:
    """A saved env step that may be unset: None, or a count (``SavedStateError`` if not)."""
    return None if value is None else saved_count(value, f"trainer.{name}")


def _check_tracking_store(config: RunConfig) -> None:
    """Refuse, before training, an MLflow store that MLflow would refuse after it."""
    if config.mlflow and config.mlflow_tracking_uri:
        from rlloop.logging.mlflow_sink import (
            file_store_refusal,
            sqlite_store_refusal,
            unknown_scheme_refusal,
        )

        uri = config.mlflow_tracking_uri
        reason = (unknown_scheme_refusal(uri) or file_store_refusal(uri)
                  or sqlite_store_refusal(uri))
        if reason is not None:
            raise ConfigError(reason)


def _refuse_existing_run(path: Path, *, other_files: bool = False) -> None:
    """Refuse a run directory that holds a run, or (``other_files``) anything a new run
    would write over or mix into: a new run starts in a new or empty directory."""
    if (path / "config.yaml").exists():
        raise RunDirError(f"{path} already holds a run; resume it with --resume {path} "
                          "or choose another --run-dir")
    if not other_files or (not path.exists() and not path.is_symlink()):
        return
    if not path.is_dir():
        raise RunDirError(f"--run-dir {path} is an existing file, not a directory; pick "
                          "another --run-dir")
    check_members(path)  # a planted link is named as one
    # Names the run writes (report.md, best/, metrics.jsonl, ...); other files (a shell's
    # `> run/train.log`, a job script, .gitkeep) are left alone and stay.
    found = [name for name in MEMBERS if name != ".lock" and (path / name).exists()]
    if found:
        shown = ", ".join(found[:3]) + (", ..." if len(found) > 3 else "")
        raise RunDirError(f"--run-dir {path} holds {shown} but no run: a new run would write "
                          "over them; choose a new or empty directory, or move them")


def has_checkpoint(run_dir: Path) -> bool:
    """Whether ``resume`` has a checkpoint to start from (``best/`` alone is not one)."""
    return CheckpointManager(run_dir / "checkpoints").latest() is not None


def _no_checkpoint(run_dir: Path) -> RunDirError:
    root = run_dir / "checkpoints"
    saved = [p for p in root.iterdir() if re.fullmatch(r"[0-9]+", p.name) and p.is_dir()
             ] if root.is_dir() else []
    if saved:  # it saved, but what it saved cannot be loaded
        return RunDirError(f"{run_dir} holds a run whose checkpoints ({len(saved)} in {root}) "
                           "are all damaged or incomplete (no manifest.json, or failing their "
                           "checks: see any warnings above), so it cannot be resumed; put "
                           "back an intact copy of that folder (from a backup of the run), "
                           "or start over: remove the directory or pick another --run-dir")
    return RunDirError(f"{run_dir} holds a run with no loadable checkpoint (it stopped before "
                       "its first save), so it cannot be resumed; start over: remove the "
                       "directory or pick another --run-dir")


def resume_config(run_dir: str | Path, *, allow_import: bool = False, env: str | None = None,
                  file: str | Path | None = None, sets: list[str] | None = None,
                  **flags: Any) -> RunConfig:
    """A run's saved config with the overrides a resume may apply (see
    :func:`rlloop.config.run_config.resumable`); ``ConfigError`` names any other changed setting."""
    saved = load_run_config(run_dir, allow_import=allow_import)
    old = saved.to_dict()
    config = build_config(saved.algo, env, file=file, flags=flags, sets=sets, base=old)
    new = config.to_dict()
    changed = [f"{key}.{sub}" for key, value in new.items()
               if isinstance(value, dict) and key != "env_kwargs"
               for sub in value if value[sub] != (old.get(key) or {}).get(sub)]
    changed += [key for key, value in new.items()
                if not (isinstance(value, dict) and key != "env_kwargs") and value != old[key]]
    fixed = [key for key in changed if not resumable(key, saved.algo)]
    if fixed:
        raise ConfigError(f"a resumed run cannot change {', '.join(fixed)} (a resume "
                          "continues the run as it was set up: its env, networks, optimisers "
                          "and data follow its settings); drop the override or start a new "
                          "run. A resume may change budgets, stop rules, evaluation, "
                          "checkpoint and logging settings")
    return config


def resume(run_dir: str | Path, *, console: Any = None, allow_import: bool = False,
           env: str | None = None, file: str | Path | None = None,
           sets: list[str] | None = None, callbacks: Sequence[Callback] = (),
           started_at: float | None = None, **flags: Any) -> RunResult:
    """Continue a run from its last checkpoint with its saved config, changed by the
    overrides a resume allows (``flags``, ``--set`` items, a YAML ``file``); ``started_at``
    as for `train`."""
    ensure_free(check_run_dir(run_dir))  # fail fast if a trainer holds it
    config = resume_config(run_dir, allow_import=allow_import, env=env, file=file, sets=sets,
                           **flags)
    _check_endpoints(Path(run_dir), config, file=file, sets=sets, flags=flags)
    if not has_checkpoint(Path(run_dir)):  # before Session starts envs and sinks
        raise _no_checkpoint(Path(run_dir))
    return _run_session(config, Path(run_dir), resume=True, console=console,
                        callbacks=callbacks, started_at=started_at)


def _check_endpoints(run_dir: Path, config: RunConfig, *, file: str | Path | None,
                     sets: list[str] | None, flags: dict[str, Any]) -> None:
    """Refuse a server or outside store that the run's saved config names (its MLflow
    tracking URI, its Ray address) unless the user names it again for this resume: a
    copied run directory would otherwise send the user's credentials, and the run's
    files, wherever it says."""
    saved = load_yaml(run_dir / "config.yaml")
    if not config.mlflow:  # no store is opened
        saved.pop("mlflow_tracking_uri", None)
    restated = {parse_set(item)[0] for item in sets or []}
    restated |= set(saved_endpoints(load_yaml(file) if file else {}))
    restated |= set(saved_endpoints({k: v for k, v in flags.items() if v is not None}))
    check_saved_endpoints(saved, source=str(run_dir), restated=restated,
                          consent="--set {key}={value} (Python: the same setting to load())")


def _in_thread(work: Callable[[], Any]) -> Callable[[], Any]:
    """Start ``work`` in a thread; the function returned waits for it and returns its
    result (or raises its exception)."""
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = work()
        except BaseException as e:  # handed to the waiting thread
            outcome["error"] = e

    thread = threading.Thread(target=target, name="rlloop-end-of-run", daemon=True)
    thread.start()

    def wait() -> Any:
        thread.join()
        if "error" in outcome:
            raise outcome["error"]
        return outcome.get("value")

    return wait


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return {}


def _write_json(path: Path, data: dict[str, Any]) -> None:
    write_file(path, json.dumps(data, indent=2))


@contextmanager
def _quiet(quiet: bool) -> Iterator[None]:
    """Hide the sinks' warnings (and their tracebacks) while ``quiet``."""
    logger = logging.getLogger("rlloop.logging")
    level = logger.level
    if quiet:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)
