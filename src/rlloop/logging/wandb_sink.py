"""Weights & Biases sink (``--set wandb=true``): one W&B run per rlloop run.

It runs offline unless ``WANDB_MODE`` says otherwise: the run is written under
``<run>/wandb/offline-run-*`` with no network and no account, and ``wandb sync`` uploads it
later. With ``WANDB_MODE=online`` (and a login) it streams to the W&B server instead.
A resumed rlloop run continues the same W&B run (its id is kept in ``run.json``).

The run loads it in a `ProcessSink` child like MLflow: importing ``wandb`` and starting its
service takes seconds the training loop never waits for.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rlloop.logging.keys import flatten_mapping

#: W&B's own exit codes for a run's end state: anything but 0 marks the run failed.
_EXIT_CODES = {"FINISHED": 0, "KILLED": 255}


class WandbSink:
    """Log to a W&B run in ``<run_dir>/wandb``; ``run_id`` resumes an existing one."""

    def __init__(self, run_dir: str | Path, *, project: str = "rlloop",
                 name: str | None = None, run_id: str | None = None) -> None:
        try:
            import wandb
        except ImportError as exc:
            raise ImportError("wandb=true needs the wandb package: pip install "
                              "'rlloop[wandb]'") from exc
        # Offline by default: a run must never stall or fail for want of network or login.
        mode = os.environ.get("WANDB_MODE") or "offline"
        os.environ.setdefault("WANDB_SILENT", "true")
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        self._run = wandb.init(
            project=project, name=name, dir=str(run_dir), mode=mode,  # type: ignore[arg-type]
            id=run_id, resume="allow" if run_id else None,
            settings=wandb.Settings(console="off", silent=True))
        self.run_id: str = self._run.id

    def log_params(self, params: Mapping[str, Any]) -> None:
        self._run.config.update(flatten_mapping(params), allow_val_change=True)

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        # Rows of one env step (training, then evaluation) join one W&B history row.
        self._run.log({k: float(v) for k, v in metrics.items()}, step=int(step))

    def close(self, status: str = "FINISHED") -> None:
        self._run.finish(exit_code=_EXIT_CODES.get(status, 1))
