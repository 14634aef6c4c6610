"""Seconds per phase of a whole run: start-up, evaluation, checkpoints, logging, video, report.

The trainer times its own iterations (``time/env_s``, ``time/learn_s``, ...); these are the
phases around it, logged once at the end of the run as ``time/<phase>_s`` so a slow run
shows where its time went (``time/startup_s`` counts from the process's start for the CLI).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from rlloop.logging.sinks import Sink


class PhaseTimes:
    """Accumulated wall seconds per named phase.

    Args:
        started_at: ``time.time()`` at which the run's start-up began (default: now).
    """

    def __init__(self, started_at: float | None = None) -> None:
        self.started_at = time.time() if started_at is None else started_at
        self.seconds: dict[str, float] = {}

    def elapsed(self) -> float:
        return time.time() - self.started_at

    def add(self, phase: str, seconds: float) -> None:
        self.seconds[phase] = self.seconds.get(phase, 0.0) + float(seconds)

    @contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.add(phase, time.perf_counter() - t0)

    def stats(self) -> dict[str, float]:
        """``{"time/<phase>_s": seconds}`` and ``time/run_s``, the seconds since the start."""
        out = {f"time/{phase}_s": s for phase, s in self.seconds.items()}
        out["time/run_s"] = self.elapsed()
        return out


class TimedSink:
    """A sink whose calls are timed as the ``logging`` phase (what the training process
    itself spends on logging: console, JSONL, handing rows to the MLflow child)."""

    def __init__(self, sink: Sink, phases: PhaseTimes) -> None:
        self.sink = sink
        self.phases = phases

    def log_params(self, params: Mapping[str, Any]) -> None:
        with self.phases.timed("logging"):
            self.sink.log_params(params)

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        with self.phases.timed("logging"):
            self.sink.log_metrics(metrics, step)

    def close(self, status: str = "FINISHED") -> None:
        self.sink.close(status)
