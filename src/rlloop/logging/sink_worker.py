"""Child side of `ProcessSink`: ``python -m rlloop.logging.sink_worker``.

Reads JSON lines on stdin. The first names the sink to build::

    {"factory": "package.module:Name", "kwargs": {...}, "path": [...], "batch_interval_s": 1.0}

then ``{"op": "params", "params": {...}}``, ``{"op": "metrics", "metrics": {...}, "step": n}``,
``{"op": "artifacts", "artifacts": {path: folder}}`` and finally ``{"op": "close", "status":
"FINISHED"}``; modules named as arguments are imported before the first line is read.
Replies are JSON lines on the original stdout: ``{"ready": {"run_id": ...}}`` once the
sink is built, ``{"logged": rows, "params": n}`` after every write (and every interval
when idle), then ``{"closed": {...}}`` (with what the sink's ``result`` dict holds, if it
has one) or ``{"error": "..."}``.

Started as a plain module (not by `multiprocessing`), so the parent's ``__main__`` (a
user's script without a main guard, a notebook) is never imported again here.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import json
import os
import queue
import sys
import threading
import time
from collections.abc import Callable
from typing import IO, Any, Final

_EOF: Final[dict[str, Any]] = {"op": "eof"}
# Messages read ahead of the sink: a bound, so a sink that hangs pushes back on the parent
# (which counts and drops) instead of growing this process without limit.
_INBOX_SIZE: Final = 1000
# Metric values buffered before a write regardless of the interval (MLflow's batch limit).
_MAX_PENDING_VALUES: Final = 1000


def resolve(spec: str) -> Callable[..., Any]:
    """``"package.module:Qual.Name"`` -> the object."""
    module_name, _, qualname = spec.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj  # type: ignore[no-any-return]


def _read_lines(stream: IO[bytes], inbox: queue.Queue[dict[str, Any]]) -> None:
    for line in stream:
        if line.strip():
            inbox.put(json.loads(line))
    inbox.put(_EOF)


class _Replies:
    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream

    def send(self, **message: Any) -> None:
        # The parent may be gone (killed); nothing is left to tell it then.
        with contextlib.suppress(OSError, ValueError):
            self._stream.write(json.dumps(message, default=str) + "\n")
            self._stream.flush()


def serve(stdin: IO[bytes], replies: _Replies) -> None:
    """Build the sink named by the first line, then apply messages until close or EOF."""
    line = stdin.readline()
    if not line:  # a child started ahead (ProcessSink.prestart) that was never used
        return
    header = json.loads(line)
    for entry in header.get("path", []):
        if entry not in sys.path:
            sys.path.append(entry)  # after our own entries: only to find the factory
    sink = resolve(header["factory"])(**header.get("kwargs", {}))
    replies.send(ready={"run_id": getattr(sink, "run_id", None)})
    flush: Callable[[], None] | None = getattr(sink, "flush", None)
    interval = float(header.get("batch_interval_s", 1.0))
    inbox: queue.Queue[dict[str, Any]] = queue.Queue(_INBOX_SIZE)
    threading.Thread(target=_read_lines, args=(stdin, inbox), daemon=True).start()

    logged = params = pending_rows = pending_values = 0
    last_write = time.monotonic()

    def write() -> None:
        nonlocal logged, pending_rows, pending_values, last_write
        if flush is not None:
            flush()
        logged += pending_rows
        pending_rows = pending_values = 0
        last_write = time.monotonic()
        replies.send(logged=logged, params=params)

    # An idle sink still replies now and then: the parent reads silence as a hung sink.
    heartbeat = max(interval, 0.1)
    while True:
        due = last_write + (interval if pending_rows else heartbeat)
        try:
            message = inbox.get(timeout=max(0.0, due - time.monotonic()))
        except queue.Empty:
            write()
            continue
        op = message.get("op")
        if op == "metrics":
            sink.log_metrics(message["metrics"], int(message["step"]))
            pending_rows += 1
            pending_values += len(message["metrics"])
            if flush is None or interval <= 0 or pending_values >= _MAX_PENDING_VALUES:
                write()
        elif op == "artifacts":
            write()  # rows first: an artifact may describe them (a report)
            log_artifacts = getattr(sink, "log_artifacts", None)
            if log_artifacts is not None:
                log_artifacts(message["artifacts"])
        elif op == "params":
            sink.log_params(message["params"])
            params += 1
            replies.send(logged=logged, params=params)
        elif op in ("close", "eof"):
            write()
            # EOF without a close: the parent died (SIGKILL); mark the run as such.
            sink.close(message.get("status", "KILLED"))
            replies.send(closed={"run_id": getattr(sink, "run_id", None), "logged": logged,
                                 **getattr(sink, "result", {})})
            return


def main() -> None:
    # Replies get their own descriptor; anything the sink's libraries print goes to stderr
    # and cannot corrupt the protocol.
    replies = _Replies(os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8"))
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    try:
        # Named on the command line (ProcessSink's preload): imported while the parent
        # still works out which sink to build, e.g. MLflow while it imports torch.
        for module in sys.argv[1:]:
            importlib.import_module(module)
        serve(sys.stdin.buffer, replies)
    except Exception as exc:
        replies.send(error=f"{type(exc).__name__}: {exc}")
        sys.exit(1)
    _exit_now()


def _exit_now() -> None:
    """Exit without the interpreter's module-by-module teardown: with MLflow loaded (pandas,
    SQLAlchemy) it is 1-2 s of CPU after the sink is closed, and `ProcessSink.close` waits
    for this process to end. Exit handlers still run; a non-daemon thread a sink left
    running gets the normal exit, which waits for it."""
    if any(not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        return
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
