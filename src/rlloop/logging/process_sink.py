"""`ProcessSink`: a slow sink (MLflow) in a child process that can never block training.

Opening MLflow (importing it, opening its store) takes seconds of pure-Python work and
its writes cost ~0.3 ms per value; in a thread that work holds the GIL against a training
loop of many small torch ops (a 4 s CartPole run took 12 s). In its own process it uses
another core, and the trainer only appends to a queue.

Why not `multiprocessing`: its ``spawn`` start re-imports the parent's ``__main__``, which
runs a user's script without a main guard a second time. The child here is a plain
``python -m rlloop.logging.sink_worker`` speaking JSON lines over its stdin, so it works
from scripts and notebooks alike.

Why a queue and a writer thread: a tracking server that accepts connections and never
answers stops the child from reading its stdin; a pipe write from the training thread
would then block for good, and a blocked write keeps retrying after each signal handler,
so SIGTERM could never stop training. Here only the writer thread can block; the queue
is bounded, and rows that do not fit are dropped and counted.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging as pylogging
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Final

_log = pylogging.getLogger(__name__)

_STOP: Final[dict[str, Any]] = {"op": "stop-writer"}
_WRITE_BATCH: Final = 256  # messages per pipe write
_MAX_CLOSE_S: Final = 120.0  # close's wait for a child that keeps working, at most
_REAP_S: Final = 2.0  # after close's bounded wait: how long a killed child may take to go


def factory_spec(factory: Callable[..., Any] | str) -> str:
    """The ``"module:Qual.Name"`` the child imports to build the sink."""
    if isinstance(factory, str):
        return factory
    module, qualname = factory.__module__, factory.__qualname__
    if module == "__main__" or "<locals>" in qualname:
        raise ValueError(f"ProcessSink needs an importable sink factory; {module}.{qualname} "
                         "cannot be imported by the child process, move it into a module")
    return f"{module}:{qualname}"


#: Children started ahead of their sink (see `prestart`), by the modules they preload.
_spares: dict[tuple[str, ...], subprocess.Popen[bytes]] = {}


def _spawn(preload: Sequence[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-P", "-m", "rlloop.logging.sink_worker", *preload],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=_child_env(),
        # Its own session: Ctrl-C and group-wide signals reach only the trainer, which
        # decides when the child stops (after writing what is queued).
        start_new_session=True)


def prestart(preload: Sequence[str], *, niceness: int = 0) -> None:
    """Start the child of the next `ProcessSink` with this ``preload`` now: it imports
    those modules (MLflow: ~2 s) on another core while this process does other work (imports
    torch, builds the run), and the sink made later takes it over. An unused one is killed
    when this process exits. ``niceness`` > 0 lets the other processes go first when the
    cores are busy (a child whose work is needed last)."""
    key = tuple(preload)
    if key not in _spares:
        if not _spares:
            atexit.register(discard_spares)
        _spares[key] = proc = _spawn(key)
        if niceness and hasattr(os, "setpriority"):
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, proc.pid, os.getpriority(os.PRIO_PROCESS, 0)
                               + niceness)


def has_spare(preload: Sequence[str]) -> bool:
    """Whether `prestart` started a child with this ``preload`` that is still alive."""
    proc = _spares.get(tuple(preload))
    return proc is not None and proc.poll() is None


def discard_spares() -> None:
    """Kill the children `prestart` made that no sink took over (a run that failed first,
    or had MLflow off in its config file)."""
    for proc in _spares.values():
        proc.kill()
        _wait(proc, _REAP_S)
    _spares.clear()


class ProcessSink:
    """Run a sink in a child process; `log_params` / `log_metrics` never block.

    Args:
        factory: The sink's class or factory function, importable by name (not defined
            in ``__main__``), or its ``"module:Name"``.
        batch_interval_s: The child writes metric rows in batches at least this often
            (each row is written, at its own step; batching only saves per-call cost).
        close_timeout_s: `close` waits for the child to write what is queued for as long
            as it keeps working; once it has neither answered nor used CPU for this long,
            it is killed and the rows it did not write are reported in one warning.
        max_queued: Rows held for a child that is behind; more are dropped and counted.
        label: Names the sink in that warning, e.g. ``"MLflow (sqlite:///...)"``.
        preload: Modules the child imports before it is told which sink to build; with
            the same ``preload``, a child started by `prestart` is taken over.
        **kwargs: The factory's keyword arguments (JSON data).

    Attributes:
        info: What the child reported once its sink was built, e.g. ``{"run_id": ...}``.
        unlogged: Metric rows the child did not confirm as written (set by `close`).
    """

    def __init__(self, factory: Callable[..., Any] | str, *, batch_interval_s: float = 1.0,
                 close_timeout_s: float = 5.0, max_queued: int = 10_000,
                 label: str | None = None, preload: Sequence[str] = (),
                 **kwargs: Any) -> None:
        spec = factory_spec(factory)
        self.label = label or spec
        self.close_timeout_s = close_timeout_s
        self.max_queued = max_queued
        self.info: dict[str, Any] = {}
        self.unlogged = 0
        self._rows = 0  # metric rows given to log_metrics
        self._logged = 0  # ... and confirmed written by the child
        self._dropped = 0
        self._error: str | None = None
        self._last_reply = time.monotonic()
        self._closed = False
        self._finished = threading.Event()  # the child replied "closed" / "error" / exited
        # Unbounded queue, bounded by hand in log_metrics so the close message always fits.
        self._queue: queue.Queue[dict[str, Any]] = queue.Queue()
        spare = _spares.pop(tuple(preload), None)
        self._proc = spare if spare is not None and spare.poll() is None else _spawn(preload)
        assert self._proc.stdin is not None and self._proc.stdout is not None
        header = {"factory": spec, "kwargs": kwargs, "path": [p for p in sys.path if p],
                  "batch_interval_s": batch_interval_s}
        self._queue.put(header)
        self._writer = threading.Thread(target=self._write_loop, args=(self._proc.stdin,),
                                        daemon=True, name="rlloop-sink-writer")
        self._reader = threading.Thread(target=self._read_loop, args=(self._proc.stdout,),
                                        daemon=True, name="rlloop-sink-reader")
        self._writer.start()
        self._reader.start()

    @property
    def pid(self) -> int:
        return self._proc.pid

    # ---- training thread: never blocks ----------------------------------------------------
    def log_params(self, params: Mapping[str, Any]) -> None:
        self._queue.put({"op": "params", "params": dict(params)})

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        self._rows += 1
        if self._finished.is_set() or self._queue.qsize() >= self.max_queued:
            self._dropped += 1
            return
        self._queue.put({"op": "metrics", "metrics": dict(metrics), "step": int(step)})

    def log_artifacts(self, artifacts: Mapping[str, str]) -> None:
        """Have the sink copy files or folders (``{local path: artifact folder}``) into its
        run, after the rows queued before; sinks without ``log_artifacts`` ignore it."""
        self._queue.put({"op": "artifacts", "artifacts": dict(artifacts)})

    def close(self, status: str = "FINISHED", timeout_s: float | None = None) -> None:
        """Let the child write all queued rows and close its sink, waiting while it works;
        once it has been idle and silent for `timeout_s` (default `close_timeout_s`), kill
        it and warn in one line how many rows it did not log.

        Raises:
            RuntimeError: the child failed (e.g. its sink could not be built).
        """
        if self._closed:
            return
        self._closed = True
        timeout = self.close_timeout_s if timeout_s is None else timeout_s
        self._queue.put({"op": "close", "status": status})
        self._queue.put(_STOP)
        done = self._wait_while_busy(timeout)
        if not _wait(self._proc, _REAP_S if done else 0):
            self._proc.kill()
            _wait(self._proc, _REAP_S)
        elif self._proc.returncode and self._error is None and "logged" not in self.info:
            self._error = f"it exited with status {self._proc.returncode}"
        self._reader.join(_REAP_S)
        self._writer.join(_REAP_S)  # the child is gone: a blocked pipe write has failed
        for stream in (self._proc.stdin, self._proc.stdout):
            with contextlib.suppress(OSError):
                stream.close()  # type: ignore[union-attr]
        self.unlogged = self._rows - self._logged
        if self._error is not None:
            raise RuntimeError(f"sink process failed: {self._error}"
                               f"{self._missing_text()}")
        if not done:
            _log.warning("%s did not answer for %.0f s and was stopped%s", self.label,
                         timeout, self._missing_text())
        elif self.unlogged:
            _log.warning("%s stopped early%s", self.label, self._missing_text())

    def _wait_while_busy(self, timeout: float) -> bool:
        """Wait for the child to finish while it shows signs of work; True if it did.

        Bounded by silence rather than total time: a child that replies (after every batch
        and, when idle, every interval) or uses CPU (importing MLflow, creating a store) is
        still working; one waiting on a store that does not answer does neither.
        """
        import psutil

        start = last_active = time.monotonic()
        cpu = -1.0
        while not self._finished.wait(0.1):
            now = time.monotonic()
            with contextlib.suppress(psutil.Error):  # exiting: its stdout closes next
                times = psutil.Process(self._proc.pid).cpu_times()
                if times.user + times.system > cpu:
                    cpu, last_active = times.user + times.system, now
            if now - max(last_active, self._last_reply) > timeout or now - start > _MAX_CLOSE_S:
                return False
        return True

    def _missing_text(self) -> str:
        if not self.unlogged:
            return ""
        return (f"; {self.unlogged} of {self._rows} metric rows were not logged to it"
                f"{f' ({self._dropped} dropped while it was behind)' if self._dropped else ''}")

    # ---- background threads ---------------------------------------------------------------
    def _write_loop(self, stdin: IO[bytes]) -> None:
        try:
            while True:
                batch = [self._queue.get()]
                with contextlib.suppress(queue.Empty):
                    while len(batch) < _WRITE_BATCH:
                        batch.append(self._queue.get_nowait())
                stop = batch[-1] is _STOP
                lines = [json.dumps(m, default=str) + "\n" for m in batch if m is not _STOP]
                stdin.write("".join(lines).encode())
                stdin.flush()
                if stop:
                    stdin.close()  # EOF tells the child nothing more is coming
                    return
        except (OSError, ValueError):  # the child is gone (or killed at close)
            return

    def _read_loop(self, stdout: IO[bytes]) -> None:
        try:
            for line in stdout:
                try:
                    reply = json.loads(line)
                except ValueError:
                    continue
                self._last_reply = time.monotonic()
                if "ready" in reply:
                    self.info.update(reply["ready"])
                if "logged" in reply:
                    self._logged = int(reply["logged"])
                if "closed" in reply:
                    self.info.update(reply["closed"])
                    self._logged = int(reply["closed"]["logged"])
                if "error" in reply:
                    self._error = str(reply["error"])
        except (OSError, ValueError):
            pass
        finally:
            self._finished.set()  # the child closed its end: it has exited, or is exiting


def _wait(proc: subprocess.Popen[bytes], timeout: float) -> bool:
    try:
        proc.wait(timeout)
        return True
    except subprocess.TimeoutExpired:
        return False


def _child_env() -> dict[str, str]:
    """This process's environment, with the folder holding ``rlloop`` first on the path
    (a notebook may have found it through ``sys.path`` alone)."""
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env
