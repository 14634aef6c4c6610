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
import logging
import math
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import torch
import yaml

from rlloop.algorithms.base import AlgorithmBase, EnvSettings
from rlloop.checkpoint import (
    Checkpoint,
    CheckpointManager,
    capture_rng_state,
    restore_rng_state,
    save_replacing,
)
from rlloop.config.registry import ALGORITHMS
from rlloop.config.run_config import RunConfig
from rlloop.config.unused_settings import run_warnings
from rlloop.envs.registry import env_spec
from rlloop.learners.process_group import LearnerGroupError
from rlloop.logging import ProcessSink
from rlloop.logging.process_sink import has_spare
from rlloop.runs.build import COMPONENTS, build_algorithm
from rlloop.runs.disk_full import checkpoint_bytes, disk_full_cause, disk_full_error
from rlloop.runs.lock import RunLock
from rlloop.runs.preflight import check_run
from rlloop.runs.report import FIGURE_PRELOAD, FigureWriter
from rlloop.runs.run_dir import no_checkpoint_error, refuse_existing_run
from rlloop.runs.saved import check_finite_policy, checked_return, checked_step, saved_best_return
from rlloop.runs.sinks import RunSinks, quiet_sinks
from rlloop.runs.skip_guard import SkippedUpdatesGuard
from rlloop.runs.timing import PhaseTimes
from rlloop.runs.wrap_up import (
    end_sitting,
    stopped_notice,
)
from rlloop.system.numerics import flushed_denormals
from rlloop.system.profiling import TraceProfiler
from rlloop.system.run_files import write_file
from rlloop.system.signals import StopInterrupted, save_due, supervised, terminate_as_interrupt
from rlloop.trainers.callbacks import Callback, UserCallbacks
from rlloop.trainers.loop import OnPolicySchedule, Schedule, Stats, Trainer
from rlloop.trainers.offpolicy_schedule import OffPolicyAlgorithm, OffPolicySchedule
from rlloop.trainers.result import RunResult
from rlloop.trainers.stop_conditions import Condition, HitsUpperBound

_log = logging.getLogger(__name__)


def solve_threshold(config: RunConfig) -> float | None:
    if config.solve_threshold is not None:
        return config.solve_threshold
    return env_spec(config.env, config.backend, env_kwargs=config.env_kwargs).reward_threshold


class _Checkpoints:
    """Trainer callback: periodic, on-request (SIGUSR1) and best-so-far checkpoints."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def on_step(self, trainer: Trainer, stats: Stats) -> None:
        if save_due(self.session, self.session.checkpoint_every,
                    trainer.state["algorithm/steps"]):
            self.session.save()

    def on_eval(self, trainer: Trainer, stats: Stats) -> None:
        self.session.phases.add("evals", stats.get("time/eval_s", 0.0))
        value = stats.get("eval/return_mean", math.nan)
        self.session.latest_eval_at = trainer.state[self.session.progress]
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
        """The run's steps up to training: check, build, claim the directory, open the
        sinks, make the trainer, restore."""
        self.config, self.run_dir = config, run_dir
        self.best_eval_return: float | None = None
        self.save_requested = False
        self.stop_requested: str | None = None
        self.solved = False
        self.solved_at: int | None = None  # env steps of the evaluation confirmed solved
        self.new_best = False  # this sitting saved a better policy to best/
        self.latest_eval_at: int | None = None  # the progress count of trainer.latest_eval
        self._training = False  # inside the training loop (evals there may solve the run)
        self._solve_threshold: float | None = None  # known when the loop starts
        # Off-policy algorithms run on the off-policy cadence: evals and saves counted in
        # optimisation steps (their config section), checkpoints named by them.
        self.off_policy = ALGORITHMS[config.algo].kind == "off_policy"
        self.checkpoint_every = 0 if self.off_policy else config.checkpoint_every
        #: The counter training advances: env steps; an offline run's gradient updates (its
        #: env steps stay 0, so a resume that trains on could not be told from a finished run).
        self.progress = "algorithm/steps" if ALGORITHMS[config.algo].offline else "env/steps"
        settings = check_run(config, run_dir)
        self.algorithm = self._build(settings)
        self._claim(resume)
        self.manager = CheckpointManager(run_dir / "checkpoints", keep_last=config.keep_checkpoints)
        self.sinks = RunSinks(config, run_dir, resume=resume, console=console,
                              phases=self.phases)
        self.trainer = self._make_trainer()
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

    def _build(self, settings: EnvSettings) -> AlgorithmBase:
        """The algorithm for ``settings``, and the other learner ranks when there are several."""
        config = self.config
        torch.set_num_threads(config.torch_threads)
        algorithm = build_algorithm(config, settings)
        for line in run_warnings(config):  # once the settings all fit
            _log.warning(line)
        if config.num_learners > 1:
            from rlloop.algorithms.distributed import start_learners

            start_learners(algorithm, config)
        return algorithm

    def _claim(self, resume: bool) -> None:
        """Lock the run directory before its first write (the lock creates it) and write
        its config."""
        self.lock.acquire()
        if not resume:
            refuse_existing_run(self.run_dir)  # again: another trainer may have just finished
        write_file(self.run_dir / "config.yaml",
                   yaml.safe_dump(self.config.to_dict(), sort_keys=False))

    def _make_trainer(self) -> Trainer:
        """The one loop on the algorithm's schedule, with the run's callbacks: checkpoints,
        the user's, the profiler, and last the skipped-update guard (it may stop the run,
        after the others have heard the step)."""
        config = self.config
        self.skipped_updates = SkippedUpdatesGuard(config, self.algorithm.learner)
        schedule: Schedule
        if ALGORITHMS[config.algo].offline:  # the off-policy cadence without env steps
            from rlloop.trainers.offline_schedule import OfflineSchedule

            schedule = OfflineSchedule(self.algorithm, save=lambda _: self.save())
        else:
            schedule = (OnPolicySchedule(self.algorithm, config.eval_every or None)
                        if not self.off_policy else
                        OffPolicySchedule(cast(OffPolicyAlgorithm, self.algorithm),
                                          save=lambda _: self.save()))
        self.profiler: TraceProfiler | None = None
        if config.profile is not None:
            self.profiler = TraceProfiler(config.profile, self.run_dir / "profile")
            self.profiler.label(self.algorithm, ALGORITHMS[config.algo].kind)
        trainer = Trainer(self.algorithm, sink=self.sinks.sink,
                          eval_episodes=config.eval_episodes,
                          callbacks=[_Checkpoints(self), *self.user_callbacks.each(),
                                     *([self.profiler] if self.profiler else []),
                                     self.skipped_updates],
                          schedule=schedule)
        trainer.stop_early = self._stop_now
        return trainer

    def _close_sinks(self, status: str) -> None:
        if self.sinks.closed:
            return
        if self.figure_writer is not None and status != "FINISHED":
            with contextlib.suppress(RuntimeError):  # it draws nothing then
                self.figure_writer.close(status)
        self.sinks.close(status)

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
            self.sinks.record_ids()  # what a resume from this checkpoint continues
        self.user_callbacks.checkpoint(path)
        return path

    def _restore(self) -> None:
        """Continue from the newest checkpoint this run can take: one that fails its checks
        (damaged files, or values unfit for the built run) is skipped with a warning, and
        the next older one is restored over what it set."""
        ckpt = self.manager.load_latest(expected_components=COMPONENTS,
                                        restore=self._restore_from)
        if ckpt is None:
            raise no_checkpoint_error(self.run_dir)

    def _restore_from(self, ckpt: Checkpoint) -> None:
        """Restore ``ckpt`` (a value the built run cannot take raises: see `_restore`)."""
        self.algorithm.set_state(ckpt.components["algorithm"])
        check_finite_policy(self.algorithm)
        self.trainer.set_state(ckpt.components["trainer"])
        # best/ may hold a better policy than this checkpoint knows of (one found after it
        # by a run that then crashed): a resumed run must not replace it with a worse one.
        saved = ckpt.components["trainer"]
        returns = [r for r in (checked_return(saved.get("best_eval_return")),
                               saved_best_return(self.run_dir / "best")) if r is not None]
        self.best_eval_return = max(returns) if returns else None
        self.latest_eval_at = checked_step(saved.get("latest_eval_at"), "latest_eval_at")
        state, pending = self.trainer.state, self.trainer.eval_pending()
        # Solved by this checkpoint's pending evaluation (a cut came after the solve was
        # confirmed): the resume makes that evaluation again and stops solved, as the cut
        # run would have, without confirming anew (that row is logged). (A run stopped
        # solved and resumed trains on, and is judged anew.)
        self.solved = (self.config.stop_on_solve and pending
                       and checked_step(saved.get("solved_at"), "solved_at") == state["env/steps"])
        restore_rng_state(ckpt.components["rng"])
        # Rows a crashed run logged after this checkpoint, the pending evaluation's among
        # them (a crash after a resume made it): the resumed run logs them anew.
        if self.off_policy:
            self.sinks.jsonl.drop_rows_after(state["env/steps"],
                                       ("opt/steps", state["algorithm/steps"] - pending))
        else:
            self.sinks.jsonl.drop_rows_after(state["env/steps"],
                                       also="eval/return_mean" if pending else None)

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
            self.sinks.sink.log_metrics({"eval/solve_return_mean": value,
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
            with quiet_sinks(disk_full_cause(sys.exception()) is not None):
                self._close_sinks("FAILED" if sys.exception() else "FINISHED")
        result.mlflow_ui = self.sinks.mlflow_ui()  # known once the MLflow child has answered
        self.user_callbacks.train_end(result)
        return result

    def _train_and_report(self) -> RunResult:
        trainer, cfg = self.trainer, self.config
        stats: Stats = {}
        self.phases.add("startup", self.phases.elapsed())
        self._start_steps = trainer.state[self.progress]
        self.skipped_updates.start()
        self._start_evals = self.algorithm.evals
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
                else:  # a run cut at its budget's end: its pending eval (record, save)
                    stats = trainer.finish_iteration()
                if (self.latest_eval_at == trainer.state[self.progress]
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
        # The sitting's wall time (start-up included) is known once the report is written.
        result = RunResult(self.run_dir, trainer.state["env/steps"], 0.0,
                           self.best_eval_return, stats, self._stopped_by(stats))
        return end_sitting(result, self.sinks, self.phases, self.figure_writer,
                           film=cfg.save_video and not self.stop_requested,
                           stale_video=cfg.save_video and self.new_best, config=cfg)

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
            # Steps taken (off-policy ones too, before any optimisation step), an evaluation
            # made or failed (a resume's pending one: else each resume would start from it
            # again), or a new run; not after a learner rank died: its update may be half
            # applied on rank 0.
            broken = isinstance(sys.exception(), LearnerGroupError)
            if not broken and (self.trainer.state[self.progress] > self._start_steps
                               or self.algorithm.evals != self._start_evals
                               or not self.manager.latest()):
                self.save(self._final)
        finally:
            if status != "FINISHED" or sys.exception() is not None:
                # A full disk fails the sinks too (MLflow's store); the one error line says it.
                with quiet_sinks(disk_full_cause(sys.exception()) is not None):
                    self._close_sinks(status)
                if status == "KILLED" and self.stop_requested:  # MLflow's word, not the user's
                    self.sinks.console.say(stopped_notice(self.stop_requested, self.config.algo,
                                                          self.run_dir, self.manager.latest()))
            # Else they stay open for the video, report and artifacts (closed in `_run`).
            self.algorithm.close()

    def _stopped_by(self, stats: Stats) -> str:
        if self.stop_requested:
            return f"signal {self.stop_requested}"
        if self.user_callbacks.stopped_by:
            return self.user_callbacks.stopped_by
        if self.solved:
            return "solved"
        schedule = self.trainer.schedule
        return schedule.stop_reason if schedule.finished(self.trainer) else "budget"

