"""The one training loop: step (collect -> update -> log), eval, and run until a stop rule.

Every algorithm and task runs on :class:`Trainer`. What one iteration does and when the
counters call for an eval, a record or a save is its :class:`Schedule`:

* :class:`OnPolicySchedule` (the default): rl8's trainer. One iteration collects a rollout and
  updates once; ``run(steps_per_eval=k)`` evaluates every k updates.
* ``OffPolicySchedule`` (``rlloop.offpolicy_trainer``): the off-policy cadence. One iteration is one
  batched env step and the optimisation steps that fell due; evals, records, saves and
  ``max_opts`` are counted in optimisation steps.

Counters (rl8's names): ``algorithm/collects``, ``algorithm/steps`` (updates) and
``env/steps``. ``horizons_per_env_reset`` decides when training envs are reset (every k
collects, or only once when k < 0) and constrains when an eval may use another env config.
Callbacks (checkpoints, signals) hang on the loop's ``on_step`` and ``on_eval`` hooks.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, cast

from torch import Tensor

from rlloop.conditions import Condition
from rlloop.numerics import flushed_denormals
from rlloop.signals import atomic

Stats = dict[str, float]


class Algorithm(Protocol):
    """What the trainer needs from an algorithm (see ``AlgorithmBase``)."""

    name: str

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

    def step(self, trainer: Trainer, env_config: dict[str, Any] | None) -> Stats:
        """One iteration (collect -> update -> log); returns its flat stats."""
        ...

    def start(self, trainer: Trainer, steps_per_eval: int | None,
              eval_env_config: dict[str, Any] | None) -> None:
        """Check and apply ``run``'s arguments before the first iteration."""
        ...

    def eval_due(self, trainer: Trainer) -> bool:
        """Whether ``run`` evaluates after the iteration that just ended."""
        ...

    def finished(self, trainer: Trainer) -> bool:
        """Whether the schedule itself ends the run (e.g. border's ``max_opts``)."""
        ...

    def owes(self, trainer: Trainer) -> bool:
        """Whether the restored state's last iteration owes the schedule something (a cut
        came between its update and what follows it: border's eval, record and save)."""
        ...

    def settle(self, trainer: Trainer) -> Stats:
        """Make what :meth:`owes` says the last iteration owes; its stats, or ``{}`` when
        nothing is owed."""
        ...

    def get_state(self) -> dict[str, Any]: ...
    def set_state(self, state: Mapping[str, Any]) -> None: ...


_EVAL_CONFIG_ONCE = (
    "an eval env config was given, but horizons_per_env_reset < 0 resets the training envs "
    "only once, so the config would never take effect; drop the eval env config or set "
    "horizons_per_env_reset > 0")


class Trainer:
    """Drives one algorithm. ``state`` holds the running counters (saved in checkpoints).

    Steps and evals run with subnormal floats flushed to zero (see
    :mod:`rlloop.numerics`) unless ``flush_denormal`` is False. ``schedule`` decides what
    an iteration is (default: rl8's collect + update).
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
        #: flight, where an iteration holds several: border's): the run sets it.
        self.stop_early: Callable[[], bool] = lambda: False
        #: ``algorithm/steps`` when the latest eval was made (its stats are ``latest_eval``).
        self.evaluated_at = 0
        #: Whether the latest :meth:`settle` finished something, until the next iteration:
        #: a checkpoint of this step written before it is out of date.
        self.settled = False
        # A cut (a second stop signal where an update ends, inside an eval or its
        # callbacks; a stop while eval workers start) may fall between an update and the
        # eval due after it: the eval is then owed (not made), or made but not heard (its
        # on_eval callbacks, which save best/ and confirm a solve, did not all run, or its
        # row is not logged). The checkpoint says which, and a resume makes it, or hands
        # it to the callbacks that had not heard it, first (`settle`).
        self._evaluating = False  # the latest iteration was run's (it evaluates when due)
        self._eval_owed = False  # restored: the cut run owes its last due eval
        self._unheard: int | None = None  # the first callback the latest eval is owed to

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
        self._evaluating, self.settled = evaluate, False
        with flushed_denormals(self.flush_denormal):
            stats = self.schedule.step(self, env_config)
            if evaluate and self.schedule.eval_due(self):
                stats = {**stats, **self.eval(env_config=eval_env_config)}
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
                self.eval_episodes, env_config, deterministic), log=True)

    def eval_allowed(self) -> bool:
        """Whether :meth:`eval` may run now: with ``horizons_per_env_reset=k > 0``, only
        every k collects (rl8's rule)."""
        k = self.algorithm.horizons_per_env_reset
        return not (k > 0 and self.state.get("algorithm/collects", 0) % k)

    def eval_with(self, evaluate: Callable[[], Mapping[str, float]], *,
                  log: bool = False) -> Stats:
        """Run ``evaluate``; its results as ``eval/...`` stats with ``time/eval_s``, kept
        as ``latest_eval``, handed to the callbacks' ``on_eval`` and, with ``log``,
        logged as a row."""
        t0 = time.perf_counter()
        stats = {f"eval/{key}": value for key, value in evaluate().items()}
        stats["time/eval_s"] = time.perf_counter() - t0
        self.latest_eval = stats
        # Made (an owed one too: an eval made now has its episodes), not heard yet.
        self._eval_owed, self._unheard = False, 0
        self.evaluated_at = self.state.get("algorithm/steps", 0)
        return self.hear_eval(log=log)

    def hear_eval(self, *, log: bool = False) -> Stats:
        """``latest_eval``, after handing it to the callbacks' ``on_eval`` that have not
        heard it (a cut came while they ran: the resume goes on from the one it cut) and,
        with ``log``, logging its row."""
        stats = self.latest_eval
        if self._unheard is not None:
            for i in range(self._unheard, len(self.callbacks)):
                self.callbacks[i].on_eval(self, stats)
                self._unheard = i + 1
            with atomic():  # the row and the mark that it is written: both or neither
                if log:
                    self.log(stats)
                self._unheard = None
        return stats

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
        iteration. Without conditions this runs until the schedule ends it (forever for rl8's).

        Raises:
            ValueError: arguments the schedule cannot honour (see :class:`OnPolicySchedule`
                and ``OffPolicySchedule``).
        """
        self.schedule.start(self, steps_per_eval, eval_env_config)
        eval_env_config = eval_env_config or env_config
        conditions = list(stop_conditions or [])
        owed = self.settle(eval_env_config=eval_env_config)
        if owed and any(condition(owed) for condition in conditions):
            return owed
        try:
            while True:
                stats = self._iteration(env_config, eval_env_config, evaluate=True)
                if self.schedule.finished(self) or any(condition(stats)
                                                       for condition in conditions):
                    return stats
        finally:
            # What this run owes is judged by its own cadence (a later run may evaluate
            # at another, or call step() without evaluating).
            self._eval_owed, self._evaluating = self.eval_owed(), False

    def log(self, stats: Stats) -> None:
        if self.sink is not None:
            self.sink.log_metrics(stats, step=self.state["env/steps"])

    def settle(self, *, eval_env_config: dict[str, Any] | None = None) -> Stats:
        """Finish what a cut run's last iteration left (restored from its checkpoint, or
        in this process after ``run`` was interrupted): its due eval, made on the episodes
        it would have had, or, made already, the callbacks and the row it is owed to;
        border's eval, record and save. Then that iteration ends as any does: the
        callbacks' ``on_step`` hear its stats (the eval's, with the counters). Returns
        them, or ``{}`` when nothing was left. ``run`` calls it first."""
        with flushed_denormals(self.flush_denormal):
            stats = self.schedule.settle(self)
            if self.eval_owed():
                stats = {**stats, **self.eval(env_config=eval_env_config)}
            elif self._unheard is not None:  # (rl8's eval row is logged once heard)
                stats = {**stats, **self.hear_eval(log=True)}
            self.settled = bool(stats)
            if not stats:
                return {}
            stats = self.count(stats)
            for cb in self.callbacks:  # (the run's checkpoints the settled iteration)
                cb.on_step(self, stats)
        return stats

    def owes(self) -> bool:
        """Whether the latest iteration left :meth:`settle` something to finish: its due
        eval, the callbacks or the row of one made, or the schedule's part."""
        return self.eval_owed() or self._unheard is not None or self.schedule.owes(self)

    def eval_owed(self) -> bool:
        """Whether the latest update was cut from the eval due after it (not made)."""
        return self._eval_owed or (
            self._evaluating and self.schedule.eval_due(self)
            and self.evaluated_at != self.state.get("algorithm/steps", 0))

    def get_state(self) -> dict[str, Any]:
        return {"counters": dict(self.state), "latest_eval": dict(self.latest_eval),
                "wall_time": self.wall_time, "eval_owed": self.eval_owed(),
                "evaluated_at": self.evaluated_at, "eval_unheard": self._unheard,
                **self.schedule.get_state()}

    def set_state(self, state: Mapping[str, Any]) -> None:
        self.state = {k: int(v) for k, v in state["counters"].items()}
        self.latest_eval = {k: float(v) for k, v in state["latest_eval"].items()}
        self.wall_time = float(state["wall_time"])
        # (older checkpoints: nothing owed)
        self._eval_owed = bool(state.get("eval_owed", False))
        unheard = state.get("eval_unheard")
        self._unheard = None if unheard is None else int(unheard)
        self.evaluated_at = int(state.get("evaluated_at", self.state.get("algorithm/steps", 0)))
        self.schedule.set_state(state)


RL8_COUNTERS: tuple[str, ...] = ("algorithm/collects", "algorithm/steps", "env/steps")


class OnPolicySchedule:
    """rl8's iteration: collect a rollout, update once, log; eval every ``steps_per_eval``
    updates (``run``'s argument)."""

    counters = RL8_COUNTERS

    def __init__(self, algorithm: Algorithm) -> None:
        self.algorithm = algorithm
        self.steps_per_eval: int | None = None

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

    def finished(self, trainer: Trainer) -> bool:
        return False

    def owes(self, trainer: Trainer) -> bool:
        return False  # an owed eval is the trainer's

    def settle(self, trainer: Trainer) -> Stats:
        return {}

    def get_state(self) -> dict[str, Any]:
        return {}

    def set_state(self, state: Mapping[str, Any]) -> None:
        pass
