"""Border's training loop as a schedule of the one trainer: a cadence counted in optimisation
steps.

Each step of a :class:`~rlloop.trainers.loop.Trainer` with an :class:`OffPolicySchedule` takes one
batched env step (``N`` envs; the algorithm turns it into transitions with its step
processor and pushes them to its replay buffer), then makes every optimisation step that
fell due (one per ``opt_interval`` env steps). After each optimisation step, with ``k``
optimisation steps made so far:

1. ``k % eval_interval == 0``: evaluate; callbacks' ``on_eval`` (the run's) save a new
   best under ``<run>/best``;
2. ``k % record_interval == 0``: record ``env/fps`` (env steps/s) and
   ``opt/steps_per_sec`` since the last record, times and episode statistics;
3. after an eval or a record: write one record, with the optimisation stats from the
   recorder, to the sink (every sink of a ``MultiSink``);
4. ``save_interval > 0`` and ``k % save_interval == 0``: ``save(k)`` (the run writes
   ``<run>/checkpoints/<k>``);
5. ``k == max_opts``: stop.

Optimisation steps the algorithm skips (warm-up) are not counted, as in border. Border's
record names map to rlloop's flat keys: ``env_steps`` -> ``env/steps``, ``fps`` ->
``env/fps``, ``opt_steps`` -> ``opt/steps``, ``opt_steps_per_sec`` ->
``opt/steps_per_sec``, ``eval_reward`` -> ``eval/return_mean``. Throughput excludes time
spent evaluating and saving.

Counters (rl8's names): ``env/steps`` counts transitions, ``algorithm/steps``
optimisation steps and ``algorithm/collects`` batched env steps.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from torch import Tensor

from rlloop.algorithms.offpolicy_loop import opts_due
from rlloop.algorithms.offpolicy_parts import EVALUATORS, RECORDERS, Evaluator, Recorder
from rlloop.config.offpolicy import OffPolicyConfig
from rlloop.errors import saved_count
from rlloop.system.signals import atomic
from rlloop.trainers.loop import RL8_COUNTERS, Algorithm, Stats, Trainer

_clock = time.perf_counter
_NO_EVAL_ENV_CONFIG = (
    "an eval env config was given, but off-policy training envs are reset only once "
    "(horizons_per_env_reset < 0), so the config would never take effect; drop it")


class OffPolicyAlgorithm(Algorithm, Protocol):
    """What :class:`OffPolicySchedule` needs besides the trainer's ``Algorithm``."""

    config: OffPolicyConfig

    def env_step(self) -> int:
        """One batched env step into the replay buffer; returns the env steps taken."""
        ...

    def optimize(self, env_steps: int) -> Mapping[str, Tensor | float] | None:
        """One optimisation step; ``None`` when skipped (warm-up)."""
        ...

    def episode_stats(self) -> Stats: ...


@dataclass(frozen=True)
class Cadence:
    """Border's intervals: ``opt_interval`` in env steps, the others in optimisation steps."""

    opt_interval: int = 1
    eval_interval: int = 1000
    record_interval: int = 100
    save_interval: int = 0
    max_opts: int = 0

    def __post_init__(self) -> None:
        if min(self.opt_interval, self.eval_interval, self.record_interval) <= 0:
            raise ValueError(f"cadence intervals must be > 0, got {self}")
        if self.save_interval < 0 or self.max_opts < 0:
            raise ValueError(f"save_interval and max_opts must be >= 0, got {self}")

    @classmethod
    def of(cls, config: OffPolicyConfig) -> Cadence:
        return cls(config.opt_interval, config.eval_interval, config.record_interval,
                   config.save_interval, config.max_opts)


class OffPolicySchedule:
    """Border's train step on the one loop (see the module docstring).

    Args:
        algorithm: DQN, SAC, TD3 or any :class:`OffPolicyAlgorithm`.
        cadence: Intervals; default from ``algorithm.config``.
        evaluator, recorder: Replaceable parts; default named by ``algorithm.config``.
        save: Called with the optimisation-step count every ``save_interval`` steps.
    """

    counters = RL8_COUNTERS
    stop_reason = "max_opts"

    def __init__(self, algorithm: OffPolicyAlgorithm, *, cadence: Cadence | None = None,
                 evaluator: Evaluator | None = None, recorder: Recorder | None = None,
                 save: Callable[[int], Any] | None = None) -> None:
        self.algorithm = algorithm
        #: The intervals a run starts with; ``cadence`` is the one in force (restored with
        #: the counters it judges until a run starts).
        self.configured = cadence or Cadence.of(algorithm.config)
        self.cadence = self.configured
        self.evaluator = evaluator or EVALUATORS[algorithm.config.evaluator]()
        self.recorder = recorder or RECORDERS[algorithm.config.recorder]()
        self.save = save
        self.pending_opts = 0  # due optimisation steps not made yet (a save may fall between)
        self._paused = 0.0  # seconds spent evaluating and saving, excluded from throughput
        self._pause_began: float | None = None  # of the pause in progress (an eval's record)
        self._mark_time = _clock()
        self._mark_counts = (0, 0, 0.0)  # env steps, optimisation steps, paused seconds

    def step(self, trainer: Trainer, env_config: dict[str, Any] | None) -> Stats:
        """One batched env step (unless optimisation steps are still pending), then each
        due optimisation step followed by the cadence. Returns the counters, merged with
        the record when one was written."""
        algo, state = self.algorithm, trainer.state
        t0 = _clock()
        paused = self._paused
        stats: Stats = {}
        if not self.pending_opts:
            self.pending_opts = self.collect(trainer, env_config)
        while self.pending_opts:
            # Made and counted whole, or not at all; its record too when no eval is due (a
            # cut before an eval leaves the step for the resume to evaluate and record).
            with atomic():
                self.pending_opts -= 1
                opt = algo.optimize(state["env/steps"])
                if opt is None:
                    continue
                state["algorithm/steps"] += 1
                self.recorder.add(opt)
                if not self.eval_due(trainer):
                    stats.update(self._record_if_due(trainer))
            if self.eval_due(trainer):
                stats.update(self.evaluate(trainer, None))
            else:
                self._save_if_due(trainer)
            if self.finished(trainer):
                self.pending_opts = 0
            elif trainer.stop_early():  # solved, a signal: the rest wait (saved) for a resume
                break
        trainer.wall_time += _clock() - t0 - (self._paused - paused)
        return trainer.count(stats)

    def collect(self, trainer: Trainer, env_config: dict[str, Any] | None) -> int:
        """One batched env step, counted; returns the optimisation steps it made due."""
        algo, state = self.algorithm, trainer.state
        algo.begin_horizon(state["algorithm/collects"], env_config)
        steps = algo.env_step()
        state["algorithm/collects"] += 1
        state["env/steps"] += steps
        return opts_due(state["env/steps"], steps, self.cadence.opt_interval)

    def eval_due(self, trainer: Trainer) -> bool:
        """Whether the latest optimisation step calls for an eval (every ``eval_interval``)."""
        return trainer.state["algorithm/steps"] % self.cadence.eval_interval == 0

    def evaluate(self, trainer: Trainer, eval_env_config: dict[str, Any] | None) -> Stats:
        """The latest optimisation step's eval with its record, then its save if due;
        returns the record."""
        record: Stats = self._paused_for(lambda: trainer.eval_with(
            lambda: self.evaluator.evaluate(self.algorithm, trainer.eval_episodes),
            row=lambda stats: self._record(trainer, stats)))
        self._save_if_due(trainer)
        return record

    def finished(self, trainer: Trainer) -> bool:
        """``max_opts`` optimisation steps were made."""
        return 0 < self.cadence.max_opts <= trainer.state["algorithm/steps"]

    def start(self, trainer: Trainer, steps_per_eval: int | None,
              eval_env_config: dict[str, Any] | None) -> None:
        """``steps_per_eval``, if given, replaces the cadence's ``eval_interval`` (both count
        optimisation steps).

        Raises:
            ValueError: an eval env config (off-policy training envs are reset only once).
        """
        if eval_env_config:
            raise ValueError(_NO_EVAL_ENV_CONFIG)
        self.cadence = (dataclasses.replace(self.configured, eval_interval=steps_per_eval)
                        if steps_per_eval else self.configured)
        self._mark(trainer)

    def _record_if_due(self, trainer: Trainer) -> Stats:
        """The latest optimisation step's record, logged, if one is due (``{}`` if not)."""
        if trainer.state["algorithm/steps"] % self.cadence.record_interval:
            return {}
        record = self._record(trainer, {})
        trainer.log(record)
        return record

    def _record(self, trainer: Trainer, eval_stats: Stats) -> Stats:
        """The latest optimisation step's record: the recorder's stats and ``eval_stats``,
        throughput when a record is due, the counters."""
        opt_steps = trainer.state["algorithm/steps"]
        record = {**self.recorder.pop(), **eval_stats}
        if opt_steps % self.cadence.record_interval == 0:
            record.update(self._throughput(trainer))
        trainer.count(record)
        record["opt/steps"] = float(opt_steps)
        return record

    def _save_if_due(self, trainer: Trainer) -> None:
        opt_steps, every = trainer.state["algorithm/steps"], self.cadence.save_interval
        if every and opt_steps % every == 0 and self.save is not None:
            save = self.save
            self._paused_for(lambda: save(opt_steps))

    def _paused_for(self, work: Callable[[], Any]) -> Any:
        """Run ``work``; its time is excluded from throughput and the wall time."""
        t0 = self._pause_began = _clock()
        try:
            return work()
        finally:
            self._paused += _clock() - t0
            self._pause_began = None

    def _paused_until(self, now: float) -> float:
        """Seconds paused until ``now``: an eval's record is made before its pause ends."""
        began = self._pause_began
        return self._paused + (0.0 if began is None else now - began)

    def _throughput(self, trainer: Trainer) -> Stats:
        now = _clock()
        env_steps, opt_steps, paused = self._mark_counts
        elapsed = max(now - self._mark_time - (self._paused_until(now) - paused), 1e-9)
        state = trainer.state
        made = (state["env/steps"] - env_steps, state["algorithm/steps"] - opt_steps)
        # (nothing made since the mark: the record of an eval a cut left for the resume;
        # its rates died with the cut)
        out: Stats = {"env/fps": made[0] / elapsed,
                      "opt/steps_per_sec": made[1] / elapsed} if any(made) else {}
        out.update({**self.algorithm.episode_stats(), **self.algorithm.pop_times(),
                    "time/total_s": trainer.wall_time})
        self._mark(trainer, now)
        return out

    def _mark(self, trainer: Trainer, now: float | None = None) -> None:
        self._mark_time = _clock() if now is None else now
        self._mark_counts = (trainer.state["env/steps"], trainer.state["algorithm/steps"],
                             self._paused_until(self._mark_time))

    def get_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {"pending_opts": self.pending_opts,
                                 "eval_interval": self.cadence.eval_interval}
        get = getattr(self.recorder, "get_state", None)
        if get is not None:  # the stats it holds since the last record
            state["recorder"] = {"kind": type(self.recorder).__name__, "state": get()}
        return state

    def set_state(self, state: Mapping[str, Any]) -> None:
        """``state`` is the trainer's (its counters restored already)."""
        self.pending_opts = saved_count(state.get("pending_opts", 0), "trainer.pending_opts")
        saved = state.get("recorder")
        restore = getattr(self.recorder, "set_state", None)
        # (a resume may pick another recorder: its records start afresh)
        if saved is not None and restore is not None and (
                saved["kind"] == type(self.recorder).__name__):
            restore(saved["state"])
        # The counters' eval interval judges whether their eval is pending (a resume may
        # evaluate at another from its start on; rlloop 2cb7bfe or before: the configured).
        every = state.get("eval_interval", self.configured.eval_interval)
        every = saved_count(every, "trainer.eval_interval") or self.configured.eval_interval
        self.cadence = dataclasses.replace(self.configured, eval_interval=every)
        counters = state["counters"]
        self._mark_time = _clock()
        self._mark_counts = (int(counters["env/steps"]), int(counters["algorithm/steps"]),
                             self._paused)

