"""The trainer: step (collect + update + log), eval, and run until a stop condition.

Semantics follow rl8's trainer: counters ``algorithm/collects``, ``algorithm/steps``
and ``env/steps``; ``horizons_per_env_reset`` decides when training envs are reset
(every k collects, or only once when k < 0) and constrains when an eval may use a
different env config.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from torch import Tensor

from rlloop.conditions import Condition
from rlloop.numerics import flushed_denormals

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


class MetricsSink(Protocol):
    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None: ...


class Callback(Protocol):
    """Run-level behaviour (checkpoints, signals) attached without touching the loop."""

    def on_step(self, trainer: Trainer, stats: Stats) -> None: ...
    def on_eval(self, trainer: Trainer, stats: Stats) -> None: ...


_EVAL_CONFIG_ONCE = (
    "an eval env config was given, but horizons_per_env_reset < 0 resets the training envs "
    "only once, so the config would never take effect; drop the eval env config or set "
    "horizons_per_env_reset > 0")


class Trainer:
    """Drives one algorithm. ``state`` holds the running counters (saved in checkpoints).

    Steps and evals run with subnormal floats flushed to zero (see
    :mod:`rlloop.numerics`) unless ``flush_denormal`` is False.
    """

    def __init__(self, algorithm: Algorithm, *, sink: MetricsSink | None = None,
                 eval_episodes: int = 10, callbacks: Sequence[Callback] = (),
                 flush_denormal: bool = True) -> None:
        self.algorithm = algorithm
        self.flush_denormal = flush_denormal
        self.sink = sink
        self.eval_episodes = eval_episodes
        self.callbacks = list(callbacks)
        self.state: dict[str, int] = {"algorithm/collects": 0, "algorithm/steps": 0,
                                      "env/steps": 0}
        self.latest_eval: Stats = {}
        self.wall_time = 0.0

    def step(self, *, env_config: dict[str, Any] | None = None) -> Stats:
        """One iteration: collect experience, update the policy, log; returns flat stats."""
        with flushed_denormals(self.flush_denormal):
            return self._step(env_config)

    def _step(self, env_config: dict[str, Any] | None) -> Stats:
        algo = self.algorithm
        algo.begin_horizon(self.state["algorithm/collects"], env_config)
        t0 = time.perf_counter()
        collect_stats = algo.collect()
        new_steps = int(collect_stats.pop("env/steps"))
        self.state["algorithm/collects"] += 1
        self.state["env/steps"] += new_steps
        t1 = time.perf_counter()
        learn_stats = algo.update(self.state["env/steps"])
        t2 = time.perf_counter()
        self.state["algorithm/steps"] += 1
        self.wall_time += t2 - t0
        stats: Stats = {**collect_stats, **learn_stats, **algo.pop_times(),
                        "time/learn_s": t2 - t1, "time/iteration_s": t2 - t0,
                        "time/total_s": self.wall_time,
                        "env/steps_per_s": new_steps / max(t2 - t0, 1e-9)}
        stats.update({k: float(v) for k, v in self.state.items()})
        self._log(stats)
        for cb in self.callbacks:
            cb.on_step(self, stats)
        return stats

    def eval(self, *, env_config: dict[str, Any] | None = None,
             deterministic: bool = True) -> Stats:
        """Evaluate on whole episodes of a separate eval env; returns ``eval/...`` stats.

        Raises:
            ValueError: an env config is given while envs are reset only once.
            RuntimeError: called between two ``horizons_per_env_reset`` boundaries.
        """
        k = self.algorithm.horizons_per_env_reset
        collects = self.state["algorithm/collects"]
        if env_config and k < 0 and collects:
            raise ValueError(_EVAL_CONFIG_ONCE)
        if k > 0 and collects % k:
            raise RuntimeError(
                f"eval can only be called every horizons_per_env_reset={k} collects (now at "
                f"{collects}); call it at a multiple of {k}")
        with flushed_denormals(self.flush_denormal):
            stats = self._eval_with(lambda: self.algorithm.evaluate(
                self.eval_episodes, env_config, deterministic))
        self._log(stats)
        return stats

    def _eval_with(self, evaluate: Callable[[], Mapping[str, float]]) -> Stats:
        """Run ``evaluate``; its results as ``eval/...`` stats with ``time/eval_s``, kept
        as ``latest_eval`` and handed to the callbacks' ``on_eval``."""
        t0 = time.perf_counter()
        stats = {f"eval/{key}": value for key, value in evaluate().items()}
        stats["time/eval_s"] = time.perf_counter() - t0
        self.latest_eval = stats
        for cb in self.callbacks:
            cb.on_eval(self, stats)
        return stats

    def run(
        self,
        *,
        env_config: dict[str, Any] | None = None,
        eval_env_config: dict[str, Any] | None = None,
        steps_per_eval: int | None = None,
        stop_conditions: Sequence[Condition] | None = None,
    ) -> Stats:
        """Step (and eval every ``steps_per_eval`` steps) until any stop condition holds.

        Conditions see the latest train stats merged with the eval stats of the same
        iteration. Without conditions this runs forever.

        Raises:
            ValueError: an eval env config with envs reset only once, or
                ``steps_per_eval`` not a multiple of ``horizons_per_env_reset``.
        """
        k = self.algorithm.horizons_per_env_reset
        if steps_per_eval and k < 0 and eval_env_config:
            raise ValueError(_EVAL_CONFIG_ONCE)
        if steps_per_eval and k > 0 and steps_per_eval % k:
            raise ValueError(
                f"steps_per_eval={steps_per_eval} must be a multiple of "
                f"horizons_per_env_reset={k}, because evals may only happen at reset boundaries")
        eval_env_config = eval_env_config or env_config
        conditions = list(stop_conditions or [])
        while True:
            stats = self.step(env_config=env_config)
            if steps_per_eval and self.state["algorithm/steps"] % steps_per_eval == 0:
                stats = {**stats, **self.eval(env_config=eval_env_config)}
            if any(condition(stats) for condition in conditions):
                return stats

    def _log(self, stats: Stats) -> None:
        if self.sink is not None:
            self.sink.log_metrics(stats, step=self.state["env/steps"])

    def get_state(self) -> dict[str, Any]:
        return {"counters": dict(self.state), "latest_eval": dict(self.latest_eval),
                "wall_time": self.wall_time}

    def set_state(self, state: Mapping[str, Any]) -> None:
        self.state = {k: int(v) for k, v in state["counters"].items()}
        self.latest_eval = {k: float(v) for k, v in state["latest_eval"].items()}
        self.wall_time = float(state["wall_time"])
