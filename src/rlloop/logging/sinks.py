"""Where reduced metrics go: the `Sink` protocol, a JSON-lines file, and a fan-out.

The MLflow, TensorBoard and console sinks live in their own modules and import their
backends lazily, so ``import rlloop.logging`` stays cheap.
"""

from __future__ import annotations

# Absolute import: inside the package `rlloop.logging` this is still the standard library.
import json
import logging as pylogging
import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from rlloop.logging.keys import flatten_mapping
from rlloop.system.run_files import open_append, write_file

_log = pylogging.getLogger(__name__)


@runtime_checkable
class Sink(Protocol):
    """A metrics destination. `log_metrics` is called once per report, not per env step."""

    def log_params(self, params: Mapping[str, Any]) -> None:
        """Record the run's configuration (nested mappings are flattened to ``"a/b"``)."""
        ...

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """Record flat ``{"a/b": value}`` metrics at `step` (the env-step count)."""
        ...

    def close(self, status: str = "FINISHED") -> None:
        """Flush and release; `status` is ``"FINISHED"``, ``"FAILED"`` or ``"KILLED"``."""
        ...


class JsonlSink:
    """Append one JSON object per `log_metrics` call, ``{"step": ..., "a/b": ...}``, to `path`.

    The file is line-buffered and opened for appending, so a resumed run continues the same
    file. Params go to a sidecar ``<stem>.params.json`` (merged, newest wins), keeping every
    line of the JSONL file a metrics row. Non-finite values are written as ``NaN`` /
    ``Infinity``, which Python's `json` reads back.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.params_path = self.path.with_suffix(".params.json")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        needs_newline = self._ends_mid_line(self.path)
        self._file = open_append(self.path)
        if needs_newline:
            # A crash mid-write left a partial last line; start the resumed rows on a new one.
            self._file.write("\n")

    @staticmethod
    def _ends_mid_line(path: Path) -> bool:
        if not path.exists() or path.stat().st_size == 0:
            return False
        with path.open("rb") as f:
            f.seek(-1, os.SEEK_END)
            return f.read(1) != b"\n"

    def drop_rows_after(self, step: int, counter: tuple[str, int] | None = None, *,
                        also: str | None = None) -> int:
        """Cut the file before its first row past ``step`` (a resume from an older
        checkpoint logs those steps again); how many rows went. ``counter`` (a key and
        its value at the checkpoint) also cuts a row of ``step`` itself whose key is past
        the value (off-policy saves fall between the optimisation steps of one env step);
        ``also``, a row of ``step`` that holds that key (an evaluation the resume makes
        again). Truncates in place: the append handle writes on at the new end."""
        self._file.flush()
        offset, cut = 0, None
        # The file this sink appends to (opened never through a link), read likewise.
        with os.fdopen(os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW), "rb") as f:
            lines = f.read().splitlines(keepends=True)
        for i, line in enumerate(lines):
            try:
                row = json.loads(line)
                row_step = row.get("step")
            except (ValueError, AttributeError):
                row, row_step = {}, None
            past = counter is not None and isinstance(row.get(counter[0]), int | float) and (
                row[counter[0]] > counter[1])
            if isinstance(row_step, int) and (row_step > step or (
                    row_step == step and (past or (also is not None and also in row)))):
                cut = i
                break
            offset += len(line)
        if cut is None:
            return 0
        os.ftruncate(self._file.fileno(), offset)
        return len(lines) - cut

    def log_params(self, params: Mapping[str, Any]) -> None:
        merged: dict[str, Any] = {}
        if self.params_path.exists():
            merged = json.loads(self.params_path.read_text(encoding="utf-8"))
        merged.update(flatten_mapping(params))
        # Atomic (never a half-written params file) and never through a link.
        write_file(self.params_path, json.dumps(merged, indent=2, default=str) + "\n")

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        row: dict[str, Any] = {"step": int(step)}
        row.update((name, float(value)) for name, value in metrics.items())
        row["step"] = int(step)  # a metric called "step" must not hide the real one
        self._file.write(json.dumps(row) + "\n")

    def close(self, status: str = "FINISHED") -> None:
        if not self._file.closed:
            self._file.close()


class _MetricsOnly:
    """A full ``Sink`` around an object that only has ``log_metrics``."""

    def __init__(self, sink: Any) -> None:
        self.sink = sink

    def log_params(self, params: Mapping[str, Any]) -> None:
        getattr(self.sink, "log_params", lambda _: None)(params)

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        self.sink.log_metrics(metrics, step)

    def close(self, status: str = "FINISHED") -> None:
        getattr(self.sink, "close", lambda _: None)(status)


def as_sink(sink: Any) -> Sink:
    """``sink`` as a full ``Sink``: ``log_params`` and ``close`` are optional."""
    return sink if isinstance(sink, Sink) else _MetricsOnly(sink)


class MultiSink:
    """Send every call to several sinks.

    A sink that raises is disabled for the rest of the run after one warning, so a full
    disk or an unreachable tracking store never stops training. `close` still tries every
    sink, the failed ones included, so they can release files and mark their runs.
    """

    def __init__(self, sinks: Iterable[Sink]) -> None:
        self.sinks: tuple[Sink, ...] = tuple(sinks)
        self._failed: set[int] = set()

    @property
    def active(self) -> tuple[Sink, ...]:
        """The sinks that have not failed."""
        return tuple(s for i, s in enumerate(self.sinks) if i not in self._failed)

    def _disable(self, index: int, method: str) -> None:
        """One warning line naming the error (its traceback at debug level)."""
        self._failed.add(index)
        name = type(self.sinks[index]).__name__
        error = sys.exception()
        cause = " ".join(str(error).split()) if error is not None else "unknown error"
        _log.warning("%s.%s failed (%s); this sink is disabled for the rest of the run",
                     name, method, cause)
        _log.debug("%s.%s failed", name, method, exc_info=True)

    def log_params(self, params: Mapping[str, Any]) -> None:
        for i, sink in enumerate(self.sinks):
            if i in self._failed:
                continue
            try:
                sink.log_params(params)
            except Exception:
                self._disable(i, "log_params")

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        for i, sink in enumerate(self.sinks):
            if i in self._failed:
                continue
            try:
                sink.log_metrics(metrics, step)
            except Exception:
                self._disable(i, "log_metrics")

    def close(self, status: str = "FINISHED") -> None:
        for i, sink in enumerate(self.sinks):
            try:
                sink.close(status)
            except Exception:
                if i in self._failed:  # already warned about this one
                    _log.debug("closing failed sink %s raised", type(sink).__name__, exc_info=True)
                else:
                    self._disable(i, "close")


class ThrottledSink:
    """Forward to `sink` at most once every `min_interval_s` seconds (the newest values).

    Metrics whose key starts with one of `always` (evaluations, by default) are forwarded
    every time. The rows in between are dropped, so use it only where a sparse record is
    wanted; rlloop's MLflow logging does not throttle (`ProcessSink` batches every row).
    """

    def __init__(self, sink: Sink, min_interval_s: float = 1.0,
                 always: tuple[str, ...] = ("eval/",),
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.sink = sink
        self.min_interval_s = min_interval_s
        self.always = always
        self._clock = clock
        self._last = -float("inf")
        self._pending: tuple[dict[str, float], int] | None = None

    def log_params(self, params: Mapping[str, Any]) -> None:
        self.sink.log_params(params)

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        if any(k.startswith(self.always) for k in metrics):
            self.sink.log_metrics(metrics, step)
            return
        now = self._clock()
        if now - self._last >= self.min_interval_s:
            self._last = now
            self._pending = None
            self.sink.log_metrics(metrics, step)
        else:
            self._pending = (dict(metrics), step)

    def close(self, status: str = "FINISHED") -> None:
        if self._pending is not None:
            self.sink.log_metrics(*self._pending)
            self._pending = None
        self.sink.close(status)
