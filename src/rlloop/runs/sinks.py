"""A run's metrics sinks, opened and closed together: ``metrics.jsonl``, the console, MLflow,
TensorBoard and W&B; and the run ids MLflow and W&B report, kept in ``run.json`` so that a
resume continues the same tracked runs."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rlloop.checkpoint.format import rlloop_version
from rlloop.config.run_config import RunConfig
from rlloop.logging import ConsoleSink, JsonlSink, MultiSink, ProcessSink, Sink
from rlloop.runs.timing import PhaseTimes, TimedSink
from rlloop.system.run_files import write_file


class RunSinks:
    """Every sink of one sitting of a run; :attr:`sink` writes to all of them, timed.

    Attributes:
        jsonl: ``metrics.jsonl`` (a resume drops the rows a crash logged past its checkpoint).
        console: The progress display.
        mlflow: The MLflow child process (None with ``mlflow=false``) and ``mlflow_uri``.
        wandb: The W&B child process (None unless ``wandb=true``).
        sink: All of them, with the time spent in them counted as the ``log`` phase.
        closed: Whether :meth:`close` ran (a stop signal closes them early).
    """

    def __init__(self, config: RunConfig, run_dir: Path, *, resume: bool, console: Any,
                 phases: PhaseTimes) -> None:
        self.run_dir = run_dir
        saved = _read_json(run_dir / "run.json") if resume else {}
        self.identity = {"algo": config.algo, "env": config.env,
                         "mlflow_run_id": saved.get("mlflow_run_id")}
        self.console = ConsoleSink(config.planned_env_steps, console=console,
                                   enabled=config.progress)
        self.jsonl = JsonlSink(run_dir / "metrics.jsonl")
        sinks: list[Sink] = [self.jsonl, self.console]
        self.mlflow_uri: str | None = None
        self.mlflow = self._mlflow(config) if config.mlflow else None
        if self.mlflow is not None:
            sinks.append(self.mlflow)
        if config.tensorboard:
            from rlloop.logging import TensorBoardSink

            sinks.append(TensorBoardSink(run_dir / "tensorboard"))
        self.wandb = self._wandb(config, saved.get("wandb_run_id")) if config.wandb else None
        if self.wandb is not None:
            sinks.append(self.wandb)
        self.sink = TimedSink(MultiSink(sinks), phases)
        self.closed = False
        if not resume:
            self.sink.log_params(config.to_dict())
        write_file(run_dir / "run.json", json.dumps(self.identity, indent=2))

    def _mlflow(self, config: RunConfig) -> ProcessSink:
        """MLflow in a child process: importing MLflow and writing to its store is seconds of
        pure-Python work that would otherwise stall the training loop. Every row reaches it
        (batched); only a store that stops answering loses rows, and `close` then waits a
        bounded time and says how many."""
        from rlloop.logging.mlflow_sink import PRELOAD, MlflowSink
        from rlloop.logging.mlflow_store import sqlite_tracking_uri

        uri = config.mlflow_tracking_uri or sqlite_tracking_uri(self.run_dir / "mlflow.db")
        self.mlflow_uri = uri
        return ProcessSink(MlflowSink, label=f"MLflow store {uri}",
                           batch_interval_s=config.mlflow_interval_s,
                           close_timeout_s=config.mlflow_close_timeout_s,
                           tracking_uri=uri, experiment_name=config.experiment,
                           run_name=self.run_dir.name, run_id=self.identity["mlflow_run_id"],
                           preload=PRELOAD,
                           tags={"algo": config.algo, "env": config.env, "seed": config.seed,
                                 "rlloop_version": rlloop_version()},
                           source_dir=str(Path.cwd()))

    def _wandb(self, config: RunConfig, run_id: str | None) -> ProcessSink:
        """W&B in a child process (like MLflow): importing it and starting its service take
        seconds; offline by default (see `rlloop.logging.wandb_sink`)."""
        from rlloop.logging.wandb_sink import WandbSink

        if run_id is not None:
            self.identity["wandb_run_id"] = run_id
        return ProcessSink(WandbSink, label="W&B run", batch_interval_s=config.mlflow_interval_s,
                           close_timeout_s=config.mlflow_close_timeout_s,
                           run_dir=str(self.run_dir.resolve()), project=config.wandb_project,
                           name=self.run_dir.name, run_id=run_id)

    def close(self, status: str) -> None:
        """Close every sink once (MLflow's run ends with ``status``), then record the ids."""
        if self.closed:
            return
        self.closed = True
        self.sink.close(status)
        self.record_ids()

    def record_ids(self) -> None:
        """Write into run.json the MLflow and W&B run ids their children reported, once
        known: a resume continues those runs, even after this process was killed."""
        ids = {key: sink.info["run_id"] for key, sink in (("mlflow_run_id", self.mlflow),
                                                          ("wandb_run_id", self.wandb))
               if sink is not None and sink.info.get("run_id")}
        if any(self.identity.get(key) != value for key, value in ids.items()):
            self.identity.update(ids)
            write_file(self.run_dir / "run.json", json.dumps(self.identity, indent=2))

    def mlflow_ui(self) -> str | None:
        """How to open the run in MLflow; None if no row ever reached a store."""
        if self.mlflow is None or self.mlflow_uri is None or not self.mlflow.info.get("run_id"):
            return None  # never reached its store: naming it would point at nothing
        from rlloop.logging.mlflow_store import ui_hint

        return ui_hint(self.mlflow_uri)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return {}


@contextmanager
def quiet_sinks(quiet: bool) -> Iterator[None]:
    """Hide the sinks' warnings (and their tracebacks) while ``quiet``: a full disk fails
    them too, and the run's one error line already says so."""
    logger = logging.getLogger("rlloop.logging")
    level = logger.level
    if quiet:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)
