"""The one training loop: step (collect -> update -> log), eval, and run until a stop rule.

Every algorithm and task runs on :class:`Trainer`. What one iteration does and when the
counters call for an eval, a record or a save is its :class:`Schedule`:

* :class:`OnPolicySchedule` (the default): one iteration collects a rollout and updates
  once; ``run(steps_per_eval=k)`` evaluates every k updates.
* ``OffPolicySchedule`` (``rlloop.trainers.offpolicy_schedule``): the off-policy cadence.
  One iteration is one batched env step and the optimisation steps that fell due; evals,
  records, saves and ``max_opts`` are counted in optimisation steps.

Counters (rl8's names): ``algorithm/collects``, ``algorithm/steps`` (updates) and
``env/steps``. ``horizons_per_env_reset`` decides when training envs are reset (every k
collects, or only once when k < 0) and constrains when an eval may use another env config.
Callbacks (checkpoints, signals) hang on the loop's ``on_step`` and ``on_eval`` hooks.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, cast

from torch import Tensor

from rlloop.errors import SavedStateError, saved_count
from rlloop.system.numerics import flushed_denormals
from rlloop.system.signals import atomic
from rlloop.trainers.stop_conditions import Condition

Stats = dict[str, float]


class Algorithm(Protocol):
    """What the trainer needs from an algorithm (see ``AlgorithmBase``)."""

    name: str
    evals: int

    @property
    def horizons_per_env_reset(self) -> int: ...
    def begin_horizon(self, collects: int, env_config: dict[str, Any] | None) -> None: ...
    def collect(self) -> Stats: ...
    def update(self, env_steps: int) -> Stats: ...
    def act(self, obs: Tensor, deterministic: bool = True) -> Tensor: ...
    def evaluate(self, episodes: int, env_config: dict[str, Any] | None = None,
                 deterministic: bool = True) -> Stats: ...
    def pop_times(self) -> Stats: ...


class Evaluable(Protocol):
    """What the trainer itself needs of what it trains: evaluation (a schedule needs more)."""

    evals: int
    """Evaluations made so far: the next one's episodes are seeded by it."""

    @property
    def horizons_per_env_reset(self) -> int: ...
    def evaluate(self, episodes: int, env_config: dict[str, Any] | None = None,
                 deterministic: bool = True) -> Stats: ...


class MetricsSink(Protocol):
    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None: ...


class Callback(Protocol):
    """Run-level behaviour (checkpoints, signals) attached without touching the loop."""

    def on_step(self, trainer: Trainer, stats: Stats) -> None: ...
    def on_eval(self, trainer: Trainer, stats: Stats) -> None: ...


class Schedule(Protocol):
    """What one iteration of the loop does, and when the counters call for an eval or a stop."""

    counters: tuple[str, ...]
    """The names of the trainer's counters (``Trainer.state``)."""

    stop_reason: str
    """The run's ``stopped_by`` where :meth:`finished` ends it."""

    def step(self, trainer: Trainer, env_config: dict[str, Any] | None) -> Stats:
        """One iteration (collect -> update -> log); returns its flat stats."""
        ...

    def start(self, trainer: Trainer, steps_per_eval: int | None,
              eval_env_config: dict[str, Any] | None) -> None:
        """Check and apply ``run``'s arguments before the first iteration."""
        ...

    def eval_due(self, trainer: Trainer) -> bool:
        """Whether the cadence calls for an eval after the trainer's latest update."""
        ...

    def evaluate(self, trainer: Trainer, eval_env_config: dict[str, Any] | None) -> Stats:
        """Make the eval due after the latest update, with what the schedule writes along
        with it (the off-policy record and save); returns its stats."""
        ...

    def finished(self, trainer: Trainer) -> bool:
        """Whether the schedule itself ends the run (e.g. the off-policy ``max_opts``)."""
        ...

    def get_state(self) -> dict[str, Any]:
        """With the eval cadence in force: it judges the restored update's eval."""
        ...

    def set_state(self, state: Mapping[str, Any]) -> None: ...


_EVAL_CONFIG_ONCE = (
    "an eval env config was given, but horizons_per_env_reset < 0 resets the training envs "
    "only once, so the config would never take effect; drop the eval env config or set "
    "horizons_per_env_reset > 0")


class Trainer:
    """Drives one algorithm. ``state`` holds the running counters (saved in checkpoints).

    Steps and evals run with subnormal floats flushed to zero (see
    :mod:`rlloop.system.numerics`) unless ``flush_denormal`` is False. ``schedule`` decides what
    an iteration is (default: rl8's collect + update).

    A checkpoint holds the loop at an iteration boundary, or at one point inside an
    iteration: its update made, the eval due after it not yet (a second stop signal where
    the update ends, or a cut anywhere in that eval: :meth:`eval_with` makes an eval whole
    or not at all). Whether that eval is pending is derived from the counters
    (:meth:`eval_pending`); ``run`` makes it first, on the same episodes.
    """

    def __init__(self, algorithm: Evaluable, *, sink: MetricsSink | None = None,
                 eval_episodes: int = 10, callbacks: Sequence[Callback] = (),
                 flush_denormal: bool = True, schedule: Schedule | None = None) -> None:
        self.algorithm = algorithm
        self.flush_denormal = flush_denormal
        self.sink = sink
        self.eval_episodes = eval_episodes
        self.callbacks = list(callbacks)
        # Without a schedule the algorithm is rl8's: it collects and updates.
        self.schedule: Schedule = schedule or OnPolicySchedule(cast(Algorithm, algorithm))
        self.state: dict[str, int] = dict.fromkeys(self.schedule.counters, 0)
        self.latest_eval: Stats = {}
        self.wall_time = 0.0
        #: Whether the run must stop within an iteration (after the optimisation step in
        #: flight, where an iteration holds several: the off-policy one's): the run sets it.
        self.stop_early: Callable[[], bool] = lambda: False
        #: ``algorithm/steps`` when the latest eval was made (``latest_eval``, its row).
        self.evaluated_at = 0

    def step(self, *, env_config: dict[str, Any] | None = None) -> Stats:
        """One iteration of the schedule (collect -> update -> log); returns flat stats."""
        return self._iteration(env_config, None, evaluate=False)

    def _iteration(self, env_config: dict[str, Any] | None,
                   eval_env_config: dict[str, Any] | None, *, evaluate: bool) -> Stats:
        """One iteration, its eval (with ``evaluate``, where the schedule says one is due),
        then the callbacks' ``on_step``.

        ``on_step`` comes last, so a checkpoint it writes holds the iteration whole, its
        eval included (the eval count seeds the next eval: a checkpoint taken before it
        would resume with every later eval on other episodes)."""
        updates = self.state.get("algorithm/steps", 0)
        with flushed_denormals(self.flush_denormal):
            stats = self.schedule.step(self, env_config)
            # (an eval follows an update; an off-policy warm-up step makes none)
            if (evaluate and self.state.get("algorithm/steps", 0) != updates
                    and self.eval_pending()):
                stats = {**stats, **self.schedule.evaluate(self, eval_env_config)}
            for cb in self.callbacks:
                cb.on_step(self, stats)
        return stats

    def count(self, stats: Stats) -> Stats:
        """``stats`` with the counters added (as floats)."""
        stats.update({k: float(v) for k, v in self.state.items()})
        return stats

    def eval(self, *, env_config: dict[str, Any] | None = None,
             deterministic: bool = True) -> Stats:
        """Evaluate on whole episodes of a separate eval env; returns ``eval/...`` stats.

        Raises:
            ValueError: an env config is given while envs are reset only once.
            RuntimeError: called between two ``horizons_per_env_reset`` boundaries.
        """
        k = self.algorithm.horizons_per_env_reset
        collects = self.state.get("algorithm/collects", 0)  # a task counts epochs
        if env_config and k < 0 and collects:
            raise ValueError(_EVAL_CONFIG_ONCE)
        if not self.eval_allowed():
            raise RuntimeError(
                f"eval can only be called every horizons_per_env_reset={k} collects (now at "
                f"{collects}); call it at a multiple of {k}")
        with flushed_denormals(self.flush_denormal):
            return self.eval_with(lambda: self.algorithm.evaluate(
                self.eval_episodes, env_config, deterministic))

    def eval_allowed(self) -> bool:
        """Whether :meth:`eval` may run now: with ``horizons_per_env_reset=k > 0``, only
        every k collects (rl8's rule)."""
        k = self.algorithm.horizons_per_env_reset
        return not (k > 0 and self.state.get("algorithm/collects", 0) % k)

    def eval_with(self, evaluate: Callable[[], Mapping[str, float]], *,
                  row: Callable[[Stats], Stats] | None = None) -> Stats:
        """Run ``evaluate``; its results as ``eval/...`` stats with ``time/eval_s`` go to the
        callbacks' ``on_eval``, then are logged (in ``row(stats)``, with ``row``) and kept as
        ``latest_eval``. Returns the row logged.

        Made whole or not at all: a cut after the episodes (in a callback, before the row)
        sets the eval count back, so the resume makes all of it again on those episodes."""
        count = self.algorithm.evals
        t0 = time.perf_counter()
        stats = {f"eval/{key}": value for key, value in evaluate().items()}
        stats["time/eval_s"] = time.perf_counter() - t0
        made = False
        try:
            for cb in self.callbacks:
                cb.on_eval(self, stats)
            with atomic():  # the row and the count of the eval made: both or neither
                out = stats if row is None else row(stats)
                self.log(out)
                self.latest_eval = stats
                self.evaluated_at = self.state.get("algorithm/steps", 0)
                made = True
        finally:
            if not made:
                self.algorithm.evals = count
        return out

    def run(
        self,
        *,
        env_config: dict[str, Any] | None = None,
        eval_env_config: dict[str, Any] | None = None,
        steps_per_eval: int | None = None,
        stop_conditions: Sequence[Condition] | None = None,
    ) -> Stats:
        """Step (and eval where the schedule says) until any stop condition holds.

        Conditions see the latest train stats merged with the eval stats of the same
        iteration. Without conditions this runs until the schedule ends it (forever for
        rl8's). An eval that a cut left pending (see :meth:`eval_pending`) is made first.

        Raises:
            ValueError: arguments the schedule cannot honour (see :class:`OnPolicySchedule`
                and ``OffPolicySchedule``).
        """
        # Judged by the cadence the counters were reached under, before this run's applies.
        pending = self.eval_pending()
        self.schedule.start(self, steps_per_eval, eval_env_config)
        eval_env_config = eval_env_config or env_config
        conditions = list(stop_conditions or [])
        if pending:
            stats = self._end_cut_iteration(eval_env_config)
            if any(condition(stats) for condition in conditions):
                return stats
        while True:
            stats = self._iteration(env_config, eval_env_config, evaluate=True)
            if self.schedule.finished(self) or any(condition(stats)
                                                   for condition in conditions):
                return stats

    def log(self, stats: Stats) -> None:
        if self.sink is not None:
            self.sink.log_metrics(stats, step=self.state["env/steps"])

    def eval_pending(self) -> bool:
        """Whether the eval the schedule calls for after the latest update is not made: a
        cut came between the two (a checkpoint's one point inside an iteration)."""
        return (self.schedule.eval_due(self)
                and self.evaluated_at != self.state.get("algorithm/steps", 0))

    def finish_iteration(self, *, eval_env_config: dict[str, Any] | None = None) -> Stats:
        """End an iteration that a cut left with its eval pending: the eval made again, then
        the callbacks' ``on_step`` hear its stats with the counters. Returns them, or
        ``{}`` when no eval is pending (``run`` does this first)."""
        return self._end_cut_iteration(eval_env_config) if self.eval_pending() else {}

    def _end_cut_iteration(self, eval_env_config: dict[str, Any] | None) -> Stats:
        with flushed_denormals(self.flush_denormal):
            stats = self.count(self.schedule.evaluate(self, eval_env_config))
            for cb in self.callbacks:
                cb.on_step(self, stats)
        return stats

    def get_state(self) -> dict[str, Any]:
        return {"counters": dict(self.state), "latest_eval": dict(self.latest_eval),
                "wall_time": self.wall_time, "evaluated_at": self.evaluated_at,
                **self.schedule.get_state()}

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`get_state`'s output. Raises ``SavedStateError`` before changing
        anything when its counters are not this schedule's or not counts (a non-negative
        integer below 2**53: they become metric steps), or a number is not one."""
        counters = state["counters"]
        if not isinstance(counters, Mapping) or set(counters) != set(self.state):
            raise SavedStateError(f"trainer.counters must hold {sorted(self.state)}")
        latest_eval = state["latest_eval"]
        if not (isinstance(latest_eval, Mapping) and all(
                isinstance(v, int | float) and not isinstance(v, bool)
                for v in latest_eval.values())):
            raise SavedStateError("trainer.latest_eval must map names to numbers")
        wall_time = state["wall_time"]
        if not (isinstance(wall_time, int | float) and 0 <= wall_time < math.inf):
            raise SavedStateError(f"trainer.wall_time is {wall_time!r:.40}, not seconds")
        steps = {k: saved_count(v, f"trainer.counters.{k}") for k, v in counters.items()}
        updates = steps.get("algorithm/steps", 0)
        evaluated_at = saved_count(state.get("evaluated_at", updates), "trainer.evaluated_at")
        # A checkpoint of rlloop 0.1.0 may hold an eval that a cut kept from some callbacks
        # or from its row (`eval_unheard`, `cadence_at`): it is made again, as any cut eval
        # now is.
        cadence_at = saved_count(state.get("cadence_at", updates), "trainer.cadence_at")
        if state.get("eval_unheard") is not None or cadence_at < updates:
            evaluated_at = min(evaluated_at, updates - 1)
        self.state = steps
        self.latest_eval = {k: float(v) for k, v in latest_eval.items()}
        self.wall_time = float(wall_time)
        self.evaluated_at = evaluated_at
        self.schedule.set_state(state)


RL8_COUNTERS: tuple[str, ...] = ("algorithm/collects", "algorithm/steps", "env/steps")


class OnPolicySchedule:
    """rl8's iteration: collect a rollout, update once, log; eval every ``steps_per_eval``
    updates (``run``'s argument; until a run starts, the constructor's or the restored one)."""

    counters = RL8_COUNTERS
    stop_reason = "budget"  # (never: the env-step budget ends an on-policy run)

    def __init__(self, algorithm: Algorithm, steps_per_eval: int | None = None) -> None:
        self.algorithm = algorithm
        self.steps_per_eval = steps_per_eval

    def step(self, trainer: Trainer, env_config: dict[str, Any] | None) -> Stats:
        algo, state = self.algorithm, trainer.state
        algo.begin_horizon(state["algorithm/collects"], env_config)
        t0 = time.perf_counter()
        collect_stats = algo.collect()
        with atomic():  # counted and updated whole, or not at all
            new_steps = int(collect_stats.pop("env/steps"))
            state["algorithm/collects"] += 1
            state["env/steps"] += new_steps
            t1 = time.perf_counter()
            learn_stats = algo.update(state["env/steps"])
            t2 = time.perf_counter()
            state["algorithm/steps"] += 1
            trainer.wall_time += t2 - t0
            stats: Stats = {**collect_stats, **learn_stats, **algo.pop_times(),
                            "time/learn_s": t2 - t1, "time/iteration_s": t2 - t0,
                            "time/total_s": trainer.wall_time,
                            "env/steps_per_s": new_steps / max(t2 - t0, 1e-9)}
            trainer.log(trainer.count(stats))
        return stats

    def start(self, trainer: Trainer, steps_per_eval: int | None,
              eval_env_config: dict[str, Any] | None) -> None:
        """Raises ValueError: an eval env config with envs reset only once, or
        ``steps_per_eval`` not a multiple of ``horizons_per_env_reset``."""
        k = trainer.algorithm.horizons_per_env_reset
        if steps_per_eval and k < 0 and eval_env_config:
            raise ValueError(_EVAL_CONFIG_ONCE)
        if steps_per_eval and k > 0 and steps_per_eval % k:
            raise ValueError(
                f"steps_per_eval={steps_per_eval} must be a multiple of "
                f"horizons_per_env_reset={k}, because evals may only happen at reset boundaries")
        self.steps_per_eval = steps_per_eval

    def eval_due(self, trainer: Trainer) -> bool:
        every = self.steps_per_eval
        return every is not None and every > 0 and trainer.state["algorithm/steps"] % every == 0

    def evaluate(self, trainer: Trainer, eval_env_config: dict[str, Any] | None) -> Stats:
        return trainer.eval(env_config=eval_env_config)

    def finished(self, trainer: Trainer) -> bool:
        return False

    def get_state(self) -> dict[str, Any]:
        return {"steps_per_eval": self.steps_per_eval}

    def set_state(self, state: Mapping[str, Any]) -> None:
        # (a checkpoint of rlloop 2cb7bfe or before: the constructor's stands)
        if "steps_per_eval" in state:
            every = state["steps_per_eval"]
            self.steps_per_eval = None if every is None else int(every)
