"""``--profile``: `torch.profiler` around a window of training iterations.

The trace lands in ``<run>/profile/`` as a Chrome trace (``*.pt.trace.json``), which
Perfetto (ui.perfetto.dev) and TensorBoard's profiler plugin open, next to
``summary.txt``, the operator table sorted by CPU time. Each iteration's work is
labelled with the phase it belongs to: ``collect`` (env steps and policy inference),
``update`` (the gradient steps) and ``eval``.

Off (the default) nothing here is built: the training loop and the algorithm run as they
are, with no profiler, no labels and no per-iteration call.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlloop.errors import ConfigError
from rlloop.system.run_files import write_file

_log = logging.getLogger(__name__)

#: The algorithm methods each phase label wraps: on-policy (rl8's collect + update) and
#: off-policy (border's env step + optimisation step) iterations.
_PHASES = {"on_policy": {"collect": "collect", "update": "update", "evaluate": "eval"},
           "off_policy": {"env_step": "collect", "optimize": "update", "evaluate": "eval"}}


@dataclass
class ProfileConfig:
    """The ``profile:`` section: which training iterations `torch.profiler` records."""

    wait: int = 1
    """Iterations skipped before profiling starts (the first ones pay one-off costs)."""
    warmup: int = 1
    """Iterations profiled but discarded, so the tracer's own start-up is not in the trace."""
    active: int = 3
    """Iterations recorded into the trace."""
    record_shapes: bool = False
    """Also record the input shapes of each operator (a larger trace)."""

    def __post_init__(self) -> None:
        for name in ("wait", "warmup"):
            if isinstance(getattr(self, name), bool) or getattr(self, name) < 0:
                raise ConfigError(f"profile.{name} must be an integer >= 0, got "
                                  f"{getattr(self, name)!r}")
        if isinstance(self.active, bool) or self.active <= 0:
            raise ConfigError(f"profile.active must be an integer > 0 (iterations recorded), "
                              f"got {self.active!r}")


class TraceProfiler:
    """A trainer callback stepping `torch.profiler.profile` once per training iteration.

    `label` wraps the algorithm's phase methods in ``record_function`` so the trace shows
    which phase each operator ran in; `start` and `stop` bracket the training loop.
    """

    def __init__(self, config: ProfileConfig, out_dir: Path) -> None:
        import torch
        from torch.profiler import ProfilerActivity, profile, schedule

        self.out_dir = out_dir
        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        self._profiler = profile(
            activities=activities, record_shapes=config.record_shapes,
            schedule=schedule(wait=config.wait, warmup=config.warmup, active=config.active,
                              repeat=1),
            on_trace_ready=self._write)
        self._config = config
        self._started = False
        self.trace: Path | None = None

    def label(self, algorithm: Any, kind: str) -> None:
        """Wrap ``algorithm``'s phase methods (on this instance only) in named ranges."""
        from torch.profiler import record_function

        for method, phase in _PHASES["off_policy" if kind == "off_policy" else "on_policy"].items():
            original = getattr(algorithm, method, None)
            if original is None:
                continue
            setattr(algorithm, method, _in_range(record_function, phase, original))

    def start(self) -> None:
        self._profiler.start()
        self._started = True

    def stop(self) -> None:
        """Stop recording; a run that ended inside the active window still writes what it
        recorded. Warns in one line when the run ended before anything was recorded."""
        if not self._started:
            return
        self._started = False
        self._profiler.stop()
        if self.trace is None:
            cfg = self._config
            _log.warning("profile: the run ended before its profiled iterations (wait=%d, "
                         "warmup=%d); no trace written, lower profile.wait/profile.warmup",
                         cfg.wait, cfg.warmup)

    def on_step(self, trainer: Any, stats: Any) -> None:
        self._profiler.step()

    def on_eval(self, trainer: Any, stats: Any) -> None:
        pass

    def _write(self, prof: Any) -> None:
        from torch.profiler import tensorboard_trace_handler

        self.out_dir.mkdir(parents=True, exist_ok=True)
        before = set(self.out_dir.glob("*.pt.trace.json"))
        tensorboard_trace_handler(str(self.out_dir), worker_name="rlloop")(prof)
        written = sorted(set(self.out_dir.glob("*.pt.trace.json")) - before)
        self.trace = written[-1] if written else None
        table = prof.key_averages().table(sort_by="cpu_time_total", row_limit=40)
        write_file(self.out_dir / "summary.txt", table + "\n")


def _in_range(record_function: Any, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def traced(*args: Any, **kwargs: Any) -> Any:
        with record_function(name):
            return method(*args, **kwargs)

    return traced
