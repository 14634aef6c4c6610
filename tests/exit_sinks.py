"""Sinks for `ProcessSink` exit tests: they leave marker files when the child process runs
its exit handlers, tears its modules down, or finishes a non-daemon thread."""

from __future__ import annotations

import atexit
import threading
import time
from pathlib import Path
from typing import Any


class _Teardown:
    """Writes ``<folder>/teardown`` when garbage-collected at interpreter teardown."""

    folder: Path | None = None

    def __del__(self) -> None:
        if self.folder is not None:
            (self.folder / "teardown").write_text("ran")


_GLOBAL = _Teardown()


class MarkerSink:
    def __init__(self, folder: str, thread: bool = False) -> None:
        self.folder = Path(folder)
        _GLOBAL.folder = self.folder
        atexit.register((self.folder / "atexit").write_text, "ran")
        if thread:  # a non-daemon thread the sink left running: the exit must wait for it
            threading.Thread(target=self._late_write, daemon=False).start()

    def _late_write(self) -> None:
        time.sleep(0.5)
        (self.folder / "thread").write_text("ran")

    def log_params(self, params: Any) -> None:
        pass

    def log_metrics(self, metrics: Any, step: int) -> None:
        pass

    def close(self, status: str = "FINISHED") -> None:
        pass
