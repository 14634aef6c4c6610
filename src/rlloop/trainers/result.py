"""What a finished run reports: the value `rlloop.runs.start.train` returns and
callbacks' ``on_end`` hears."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rlloop.trainers.loop import Stats


@dataclass
class RunResult:
    """What a finished run reports."""

    run_dir: Path
    env_steps: int
    wall_time_s: float
    """This sitting's seconds, from the process's start (or ``started_at``) to the report."""
    best_eval_return: float | None
    last_stats: Stats = field(default_factory=dict)
    stopped_by: str = "budget"
    mlflow_ui: str | None = None
    """How to open the run in MLflow; None when nothing reached an MLflow store."""
