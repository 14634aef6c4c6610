"""MLflow sink over an embedded local store: a SQLite file, no tracking server.

Why SQLite: from MLflow 3.x the ``file:`` / ``./mlruns`` store is in maintenance mode and
MLflow 3.17 refuses to open it unless ``MLFLOW_ALLOW_FILE_STORE=true`` is set; the
documented replacement is ``sqlite:///mlflow.db``. Creating a new database takes ~2-3 s
(schema migrations); opening an existing one ~1 s; `log_batch` of 1000 metrics ~0.3 s.

Browse a run with::

    mlflow ui --backend-store-uri sqlite:///runs/mlflow.db

It uses `MlflowClient` directly, never the global active run of ``mlflow.start_run``, so
several sinks (and tests) in one process do not interfere. The store it opens, and the
refusals of stores a run cannot use, are :mod:`rlloop.logging.mlflow_store`.
"""

from __future__ import annotations

import logging as pylogging
import re
import subprocess
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeVar

from rlloop.logging.keys import flatten_mapping
from rlloop.logging.mlflow_store import pin_default_experiment, prepare_store, ui_hint
from rlloop.system.run_files import links_under

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

_log = pylogging.getLogger(__name__)

# MLflow's limits (mlflow.utils.validation), repeated so they are known without importing it.
MAX_KEY_LENGTH: Final = 250
MAX_PARAM_VALUE_LENGTH: Final = 6000
MAX_METRICS_PER_BATCH: Final = 1000
MAX_PARAMS_PER_BATCH: Final = 100
_TRUNCATED: Final = "...[truncated]"
# Characters MLflow accepts in names on every OS (it also allows ':' except on Windows).
_BAD_NAME_CHARS: Final = re.compile(r"[^/\w.\- ]")
_END_STATUSES: Final = frozenset({"FINISHED", "FAILED", "KILLED"})

_T = TypeVar("_T")

#: What the sink imports, for `ProcessSink`'s ``preload``: ~2 s a child can spend before
#: it learns where the store is.
PRELOAD: Final = ("mlflow.entities", "mlflow.exceptions", "mlflow.tracking",
                  "mlflow.store.tracking.sqlalchemy_store")


def git_commit(directory: str | Path) -> str | None:
    """The commit checked out in the git work tree holding ``directory``, if any."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=directory, capture_output=True,
                             text=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None  # no git, or a directory that is gone
    commit = out.stdout.strip()
    return commit if out.returncode == 0 and re.fullmatch(r"[0-9a-f]{40,64}", commit) else None


def mlflow_name(name: str) -> str:
    """Make `name` a valid MLflow metric/param key: safe characters, no empty or dot parts."""
    parts = [p for p in _BAD_NAME_CHARS.sub("_", name).split("/") if p]
    parts = ["_" if p in (".", "..") else p for p in parts]
    return ("/".join(parts) or "_")[:MAX_KEY_LENGTH]


def _param_value(value: Any) -> str:
    text = str(value)
    if len(text) > MAX_PARAM_VALUE_LENGTH:
        text = text[: MAX_PARAM_VALUE_LENGTH - len(_TRUNCATED)] + _TRUNCATED
    return text


def _chunks(items: Sequence[_T], size: int) -> list[Sequence[_T]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


class MlflowSink:
    """Log params and metrics to one MLflow run in a local store.

    Args:
        tracking_uri: e.g. ``sqlite:///runs/mlflow.db`` (see `sqlite_tracking_uri`). The
            database's folder is created if missing.
        experiment_name: Created if missing.
        run_name: Display name of a new run (ignored when resuming).
        run_id: Resume this existing run: metrics continue in the same run.
        params: Logged right away, as by `log_params`.
        flush_interval_s: Metrics are buffered and written with `log_batch` at most this
            often (and on `flush` / `close`), so the training loop pays no per-call I/O.
        artifact_location: Artifact root of a new experiment. Default for a SQLite store:
            an ``artifacts`` folder next to the database (MLflow's default is ``./mlruns``
            under the current directory); a store this sink creates gets its ``Default``
            experiment there too.
        tags: Set on the run (new or resumed).
        source_dir: Tag the run with the git commit of the work tree holding this folder
            (``mlflow.source.git.commit``), when it is in one.

    Attributes:
        run_id: The MLflow run being written; store it in checkpoints to resume.
    """

    def __init__(
        self,
        tracking_uri: str,
        experiment_name: str,
        run_name: str | None = None,
        run_id: str | None = None,
        params: Mapping[str, Any] | None = None,
        *,
        flush_interval_s: float = 2.0,
        artifact_location: str | None = None,
        tags: Mapping[str, Any] | None = None,
        source_dir: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        # Imported here: `import mlflow` takes ~2 s and most code paths never need it.
        from mlflow.tracking import MlflowClient

        self.tracking_uri = tracking_uri
        db_path, artifact_location, created = prepare_store(tracking_uri, artifact_location)
        with warnings.catch_warnings():
            # MLflow's SQL store setup emits SQLAlchemy deprecation noise users cannot act on.
            warnings.simplefilter("ignore", DeprecationWarning)
            self._client: MlflowClient = MlflowClient(tracking_uri=tracking_uri)
        all_tags = {k: str(v) for k, v in (tags or {}).items()}
        commit = git_commit(source_dir) if source_dir else None
        if commit:
            all_tags["mlflow.source.git.commit"] = commit
        if run_id is None:
            experiment_id = self._experiment_id(experiment_name, artifact_location)
            if created and db_path is not None and artifact_location is not None:
                pin_default_experiment(db_path, artifact_location)
            run = self._client.create_run(experiment_id, run_name=run_name, tags=all_tags)
        else:
            run = self._resume(run_id)
            for key, value in all_tags.items():
                self._client.set_tag(run.info.run_id, key, value)
        self.run_id: str = run.info.run_id
        self.experiment_id: str = run.info.experiment_id
        self._flush_interval_s = flush_interval_s
        self._clock = clock
        self._last_flush = clock()
        self._buffer: list[tuple[str, float, int, int]] = []
        self._names: dict[str, str] = {}
        self._closed = False
        if params:
            self.log_params(params)

    @property
    def ui_command(self) -> str:
        """The shell command that opens this store in the MLflow web UI."""
        return ui_hint(self.tracking_uri)

    def _experiment_id(self, name: str, artifact_location: str | None) -> str:
        from mlflow.exceptions import MlflowException

        experiment = self._client.get_experiment_by_name(name)
        if experiment is None:
            try:
                return self._client.create_experiment(name, artifact_location=artifact_location)
            except MlflowException:  # another process created it in between
                experiment = self._client.get_experiment_by_name(name)
                if experiment is None:
                    raise
        if experiment.lifecycle_stage == "deleted":
            raise ValueError(
                f"MLflow experiment {name!r} is deleted in {self.tracking_uri}; restore it "
                "(MlflowClient.restore_experiment) or choose another experiment name"
            )
        return str(experiment.experiment_id)

    def _resume(self, run_id: str) -> Any:
        from mlflow.exceptions import MlflowException

        try:
            run = self._client.get_run(run_id)
        except MlflowException as exc:
            if exc.error_code != "RESOURCE_DOES_NOT_EXIST":
                raise
            raise ValueError(
                f"cannot resume MLflow run {run_id!r}: it is not in {self.tracking_uri}; "
                "check the tracking URI, or start a new run (run_id=None)"
            ) from exc
        self._client.update_run(run_id, status="RUNNING")
        return run

    def log_params(self, params: Mapping[str, Any]) -> None:
        """Log flattened, stringified params (values over 6000 chars are truncated).

        MLflow params cannot change once logged: on a resumed run, params already present
        with the same value are skipped and changed ones are kept as they were, with a warning.
        """
        from mlflow.entities import Param

        flat = {mlflow_name(k): _param_value(v) for k, v in flatten_mapping(params).items()}
        existing = self._client.get_run(self.run_id).data.params
        new: list[Param] = []
        for key, value in flat.items():
            old = existing.get(key)
            if old is None:
                new.append(Param(key, value))
            elif old != value:
                _log.warning(
                    "MLflow param %r of run %s stays %r; MLflow params cannot change (new: %r)",
                    key,
                    self.run_id,
                    old,
                    value,
                )
        for chunk in _chunks(new, MAX_PARAMS_PER_BATCH):
            self._client.log_batch(self.run_id, params=chunk)

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """Buffer the metrics; write them if `flush_interval_s` has passed since the last write."""
        timestamp_ms = int(time.time() * 1000)
        names = self._names
        buffer = self._buffer
        for name, value in metrics.items():
            key = names.get(name)
            if key is None:
                key = names[name] = mlflow_name(name)
            buffer.append((key, float(value), timestamp_ms, int(step)))
        if self._clock() - self._last_flush >= self._flush_interval_s:
            self.flush()

    def flush(self) -> None:
        """Write all buffered metrics now."""
        from mlflow.entities import Metric

        self._last_flush = self._clock()
        if not self._buffer:
            return
        # Swap the buffer out first: if the write fails, the next one does not retry (and grow).
        rows, self._buffer = self._buffer, []
        metrics = [Metric(key, value, ts, step) for key, value, ts, step in rows]
        for chunk in _chunks(metrics, MAX_METRICS_PER_BATCH):
            self._client.log_batch(self.run_id, metrics=chunk)

    def log_artifacts(self, artifacts: Mapping[str, str]) -> None:
        """Copy each file or folder (``{local path: artifact folder}``, ``""`` for the
        root) into the run's artifacts; a path that does not exist is skipped."""
        for local, folder in artifacts.items():
            path = Path(local)
            # A link's target's content would be copied into the store.
            if path.is_symlink() or next(links_under(path), None) is not None:
                _log.warning("not logging %s to MLflow: it is or holds a symbolic link", path)
            elif path.is_dir():
                self._client.log_artifacts(self.run_id, str(path), folder or None)
            elif path.is_file():
                self._client.log_artifact(self.run_id, str(path), folder or None)

    def close(self, status: str = "FINISHED") -> None:
        """Flush and mark the run `status` (``FINISHED``, ``FAILED`` or ``KILLED``)."""
        if status not in _END_STATUSES:
            raise ValueError(f"status must be one of {sorted(_END_STATUSES)}, got {status!r}")
        if self._closed:
            return
        self._closed = True
        try:
            self.flush()
        finally:
            self._client.set_terminated(self.run_id, status=status)
