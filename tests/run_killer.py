"""A ``--callback`` for the crash tests: SIGKILLs its own process (a crash) once the run
has checkpointed with its MLflow run known."""

from __future__ import annotations

import os
import signal
import sqlite3
import time
from pathlib import Path

from rlloop.trainers.callbacks import Callback


def _mlflow_run_exists(db: Path) -> bool:
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
            return bool(con.execute("SELECT count(*) FROM runs").fetchone()[0])
    except sqlite3.Error:
        return False


class KillAfterTracked(Callback):
    """At its first iteration, waits (up to 120 s) for the MLflow child to create its run
    in ``$RLLOOP_TEST_RUN/mlflow.db``; SIGKILLs the process at the iteration that reaches
    ``$RLLOOP_TEST_KILL_AT`` env steps (checkpoints were written in between)."""

    def __init__(self) -> None:
        self.waited = False

    def on_step(self, stats):  # type: ignore[no-untyped-def]
        if not self.waited:
            self.waited = True
            db, deadline = Path(os.environ["RLLOOP_TEST_RUN"]) / "mlflow.db", time.time() + 120
            while not _mlflow_run_exists(db) and time.time() < deadline:
                time.sleep(0.2)
        if stats["env/steps"] >= int(os.environ["RLLOOP_TEST_KILL_AT"]):
            os.kill(os.getpid(), signal.SIGKILL)
        return None
