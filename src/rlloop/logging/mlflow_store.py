"""The MLflow store a run writes to: its URI, the refusals of stores it cannot use, and a
new SQLite store seeded from a migrated template.

Opening a store is apart from writing to it (:mod:`rlloop.logging.mlflow_sink`): a run's
checks refuse a store that cannot be used before anything is built, without importing
MLflow, and a run directory that was copied or moved has its store's artifact paths
pointed at its new place before the sink opens it.
"""

from __future__ import annotations

import contextlib
import logging as pylogging
import os
import secrets
import tempfile
import warnings
from pathlib import Path
from typing import Final
from urllib.parse import urlparse

from rlloop.system.run_files import write_file

_log = pylogging.getLogger(__name__)

_SQLITE_PREFIX: Final = "sqlite:///"
#: The first bytes of every SQLite database file.
_SQLITE_HEADER: Final = b"SQLite format 3\x00"


def sqlite_tracking_uri(db_path: str | Path) -> str:
    """``runs/mlflow.db`` -> ``sqlite:////abs/path/runs/mlflow.db`` (absolute, cwd-proof)."""
    return _SQLITE_PREFIX + str(Path(db_path).resolve())


def _sqlite_path(tracking_uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI, None for other stores and in-memory SQLite."""
    if not tracking_uri.startswith(_SQLITE_PREFIX):
        return None
    path = tracking_uri[len(_SQLITE_PREFIX) :].split("?", 1)[0]
    return None if path in ("", ":memory:") else Path(path)


def file_store_refusal(tracking_uri: str) -> str | None:
    """Why MLflow would refuse ``tracking_uri`` (its ``file:`` store, or a bare path), in
    one line naming the fix; None when it takes it. MLflow 3.x refuses the file store
    unless ``MLFLOW_ALLOW_FILE_STORE=true``, and says so only when the store opens (in the
    sink's process, after training): a run checks first. MLflow is imported only for a
    file store."""
    scheme = urlparse(tracking_uri).scheme
    if scheme not in ("", "file") and len(scheme) != 1:  # one letter: a Windows drive
        return None
    from mlflow import environment_variables

    allowed = getattr(environment_variables, "MLFLOW_ALLOW_FILE_STORE", None)
    if allowed is None or allowed.get():  # an MLflow that takes it, or the user opted in
        return None
    return (f"mlflow_tracking_uri {tracking_uri!r} is MLflow's file store, which this MLflow "
            "refuses; use a database store (e.g. sqlite:///mlruns.db), leave it unset (a "
            "store inside the run directory), or set MLFLOW_ALLOW_FILE_STORE=true")


def sqlite_store_refusal(tracking_uri: str) -> str | None:
    """Why a ``sqlite:///`` store can be neither opened nor created (a directory in the
    file's place, no write access to it or to the folder it goes in), in one line naming
    the fix; None when it can be, and for every other store. The sink would find out in
    its own process, where a run's rows are then lost; this creates nothing."""
    path = _sqlite_path(tracking_uri)
    if path is None:
        return None
    fix = ("pick a writable place (sqlite:///DIR/mlflow.db), or leave mlflow_tracking_uri "
           "unset (a store inside the run directory)")
    if path.is_dir():
        return f"mlflow_tracking_uri {tracking_uri!r} names a directory, not a database; {fix}"
    folder = path.parent  # MLflow makes the missing folders; SQLite writes its journal there
    while not folder.exists():
        folder = folder.parent
    try:
        if path.exists():
            with open(path, "r+b") as f:
                header = f.read(len(_SQLITE_HEADER))
            if header and header != _SQLITE_HEADER:  # (SQLite makes an empty file its own)
                return (f"mlflow_tracking_uri {tracking_uri!r} names a file that is not an "
                        "SQLite database; name an MLflow database or a new file, or leave "
                        "mlflow_tracking_uri unset (a store inside the run directory)")
        elif not folder.is_dir():
            return (f"mlflow_tracking_uri {tracking_uri!r} cannot be created: {folder} is a "
                    f"file; {fix}")
        os.rmdir(tempfile.mkdtemp(prefix=".rlloop-", dir=folder))
    except OSError as e:
        what = "opened" if path.exists() else f"created in {folder}"
        return (f"mlflow_tracking_uri {tracking_uri!r}: the database cannot be {what} "
                f"({e.strerror}); {fix}")
    return None


#: The tracking-store schemes MLflow itself opens (a ``+driver`` suffix aside, e.g.
#: ``postgresql+psycopg2``); plugins add theirs under the ``mlflow.tracking_store``
#: entry points.
_MLFLOW_SCHEMES: Final = frozenset({"http", "https", "sqlite", "postgresql", "mysql", "mssql",
                                    "databricks", "databricks-uc", "uc"})


def unknown_scheme_refusal(tracking_uri: str) -> str | None:
    """One line when no tracking store opens ``tracking_uri``'s scheme (``htpp://...``):
    MLflow would say so only when the store opens, after training. None when one does."""
    scheme = urlparse(tracking_uri).scheme
    if scheme in ("", "file") or len(scheme) == 1 or scheme.split("+")[0] in _MLFLOW_SCHEMES:
        return None
    from importlib.metadata import entry_points

    if scheme in {ep.name for ep in entry_points(group="mlflow.tracking_store")}:
        return None
    return (f"mlflow_tracking_uri {tracking_uri!r} has the scheme {scheme!r}, which no MLflow "
            f"tracking store opens; use http(s)://HOST:PORT for a tracking server, "
            f"sqlite:///FILE.db for a database, or leave it unset (a store inside the run "
            f"directory)")


def ui_hint(tracking_uri: str) -> str:
    """How to browse a store: its URL for a tracking server, else the ``mlflow ui`` command."""
    if tracking_uri.startswith(("http://", "https://")):
        return tracking_uri
    return f"mlflow ui --backend-store-uri {tracking_uri}"


def _template_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "rlloop"


def _seed_from_template(db_path: Path) -> None:
    """Start a new store as a copy of an empty, fully migrated one.

    Creating MLflow's schema runs dozens of migrations (seconds); it is done once per MLflow
    version into a cache folder, and every new run copies the file (milliseconds). Any
    failure leaves ``db_path`` absent, and MLflow then creates the schema itself.
    """
    import mlflow
    from mlflow.tracking import MlflowClient

    template = _template_dir() / f"mlflow-{mlflow.__version__}-empty.db"
    try:
        if not template.exists():
            template.parent.mkdir(parents=True, exist_ok=True)
            tmp = template.with_name(f".{template.name}.{secrets.token_hex(8)}.tmp")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                MlflowClient(tracking_uri=sqlite_tracking_uri(tmp)).search_experiments()
            tmp.replace(template)
        # Aside under a fresh name, then renamed: a link planted in the run directory is
        # never written through (a name of the process id could be guessed).
        write_file(db_path, template.read_bytes())
    except OSError as exc:
        _log.debug("no MLflow store template (%s); creating the schema directly", exc)


def pin_default_experiment(db_path: Path, artifact_root: str) -> None:
    """Point a new store's ``Default`` experiment at ``artifact_root`` + ``/0``.

    MLflow gives it ``./mlruns/0`` under the working directory of whoever created the
    schema: for a copy of the cached template, the directory that first built the template.
    MLflow has no API to move an experiment's artifact location, so its row is updated.
    """
    import sqlite3

    with contextlib.closing(sqlite3.connect(db_path)) as db, db:
        db.execute("UPDATE experiments SET artifact_location = ? WHERE experiment_id = 0",
                   (f"{artifact_root}/0",))


def _relocate_artifacts(db_path: Path, artifact_root: str) -> None:
    """Point a store's artifact paths at ``artifact_root`` when the store was made where it
    no longer is (its run directory copied or moved): MLflow keeps absolute paths, so a
    copy's runs would write their artifacts into the original run directory. Paths under
    the old root (``<old>/artifacts``...) move to the same place under the new one; paths
    elsewhere (an experiment the user pointed at its own location) are left alone."""
    import sqlite3

    suffix = "/" + Path(artifact_root.rstrip("/")).name  # "/artifacts"
    with contextlib.closing(sqlite3.connect(db_path)) as db, db:
        row = db.execute("SELECT artifact_location FROM experiments WHERE experiment_id = 0"
                         ).fetchone()
        location = str(row[0]) if row and row[0] else ""
        if not location.endswith(suffix + "/0"):
            return  # not a store this sink set up: nothing known to move
        old = location[: -len("/0")]
        if old == artifact_root:
            return
        for table, column in (("experiments", "artifact_location"), ("runs", "artifact_uri")):
            db.execute(f"UPDATE {table} SET {column} = ? || substr({column}, ?) "
                       f"WHERE substr({column}, 1, ?) = ?",
                       (artifact_root, len(old) + 1, len(old), old))


def _check_artifact_paths(db_path: Path, artifact_root: str) -> None:
    """ValueError unless every artifact path of the store beside a run lies in the run's
    ``artifacts`` folder: the store came with the run directory, and a path it names
    elsewhere would have the run's files written there."""
    import sqlite3

    root = artifact_root.rstrip("/")
    with contextlib.closing(sqlite3.connect(db_path)) as db:
        rows = [*db.execute("SELECT artifact_location FROM experiments"),
                *db.execute("SELECT artifact_uri FROM runs")]
    outside = sorted({str(path) for (path,) in rows
                      if path and str(path) != root and not str(path).startswith(root + "/")})
    if outside:
        raise ValueError(f"{db_path} names artifact location {outside[0]}, outside the run's "
                         f"{root}; a run's store never chooses where rlloop writes: move "
                         "mlflow.db aside (metrics.jsonl keeps every row) to start a fresh "
                         "store")


def prepare_store(tracking_uri: str, artifact_location: str | None
                  ) -> tuple[Path | None, str | None, bool]:
    """Ready a SQLite store for MLflow to open: its folder made, a new one seeded from the
    template, the artifact root (``artifacts`` beside the database, unless given) and, for
    an existing store, its artifact paths moved to where the run directory now is and
    checked. Returns the database's path (None for another store), the artifact root and
    whether the store is new (:func:`pin_default_experiment` is then due)."""
    db_path = _sqlite_path(tracking_uri)
    if db_path is None:
        return None, artifact_location, False
    db_path.parent.mkdir(parents=True, exist_ok=True)
    created = not db_path.exists()
    if created:
        _seed_from_template(db_path)
    if artifact_location is None:
        artifact_location = (db_path.parent / "artifacts").resolve().as_uri()
        if not created:  # a copied or moved run directory keeps its artifacts
            _relocate_artifacts(db_path, artifact_location)
            _check_artifact_paths(db_path, artifact_location)
    return db_path, artifact_location, created
