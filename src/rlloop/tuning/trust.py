"""A tuning study's directory is untrusted data, as a run directory is.

Someone may share a study that a user resumes (``rlloop tune --resume DIR``). So:

- its saved settings (``tune.json``: env, ``--set`` items, flags, search space; and
  ``base.yaml``) never make rlloop import a module they name (``module:Env-v0``,
  ``ppo.net=module:Class``) or contact a server they name (``mlflow_tracking_uri``,
  ``ray.address``) unless the user consents with ``--allow-import``
  (:func:`check_saved_study`); a new study's settings are the user's own and unchecked;
- rlloop never writes through a symbolic link among the study's own members
  (:func:`check_study_links`) or at a trial's run directory (:func:`check_trial_dir`),
  nor into a study database (SQLite writes it in place) that has another hard link.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rlloop.config.loading import config_layers
from rlloop.config.registry import ALGORITHMS
from rlloop.envs.imports import check_env_import, check_net_import, check_saved_endpoints
from rlloop.errors import ConfigError
from rlloop.runs.lock import LOCK_FILE
from rlloop.system.run_files import STUDY_FILE, refuse_hard_link, refuse_link
from rlloop.tuning.settings import TuneSettings
from rlloop.tuning.space import as_set

TRIALS = "trials"
MEMBERS = (STUDY_FILE, "base.yaml", "space.yaml", "best.yaml", "study.db",
           "study.db-journal", "study.db-wal", "study.db-shm", LOCK_FILE, TRIALS)
"""Every name rlloop writes directly inside a study directory (SQLite's side files too)."""
IN_PLACE = ("study.db", "study.db-journal", "study.db-wal", "study.db-shm")
"""The members written in place (``.lock`` is checked by the lock itself)."""

CONSENT = "--allow-import to trust this study's settings (Python: allow_import=True)"


def check_study_links(path: Path) -> None:
    """``RunDirError`` if a member of the study in ``path`` or one of its trial run
    directories is a symbolic link: rlloop would write through it, outside the study; or
    if its database has another hard link, which SQLite's writes would change too."""
    for member in (*(path / name for name in MEMBERS), *_trial_dirs(path)):
        _refuse_link(member)
    for name in IN_PLACE:
        refuse_hard_link(path / name)


def check_trial_dir(run_dir: Path) -> None:
    """``RunDirError`` if a trial's run directory (or ``trials/``) is a symbolic link."""
    _refuse_link(run_dir.parent)
    _refuse_link(run_dir)


def _refuse_link(member: Path) -> None:
    refuse_link(member, "a study directory", "tune in another --run-dir")


def _trial_dirs(path: Path) -> Iterator[Path]:
    trials = path / TRIALS
    if trials.is_dir() and not trials.is_symlink():
        yield from (p for p in sorted(trials.iterdir()) if p.name.startswith("trial-"))


def check_saved_study(path: Path, settings: TuneSettings, *, allow_import: bool) -> None:
    """Refuse a saved study (``path``, its ``settings`` read from ``tune.json``) whose env
    id, network (``<algo>.net``, in the settings, ``base.yaml`` or any choice of the search
    space) would import a module by name, or that sets an endpoint (MLflow tracking URI,
    Ray address), unless ``allow_import``. ``EnvError``/``ConfigError`` in one line."""
    source = str(path)
    for data in _saved_configs(path, settings):
        env = data.get("env")
        if isinstance(env, str):
            check_env_import(env, allow_import=allow_import, source=source)
        for algo in ALGORITHMS:
            section = data.get(algo)
            net = section.get("net") if isinstance(section, dict) else None
            if isinstance(net, str):
                check_net_import(net, allow_import=allow_import, source=source,
                                 key=f"{algo}.net")
        if not allow_import:
            check_saved_endpoints(data, source=source, restated=set(), consent=CONSENT)


def _saved_configs(path: Path, settings: TuneSettings) -> Iterator[dict[str, Any]]:
    """The plain config data of the study's trials as saved: its ``base.yaml``, flags and
    sets (without rlloop's own presets), then that with each choice of the space set.

    A choice the config refuses is skipped: a trial sampling it fails before it imports
    or contacts anything.
    """
    base = path / "base.yaml"
    file = base if base.is_file() else None

    def layers(extra: list[str]) -> dict[str, Any]:
        # base={} in place of the preset: only what the study itself saved is checked
        return config_layers(settings.algo, settings.env, file=file, flags=settings.flags,
                             sets=[*settings.sets, *extra], base={})

    yield layers([])
    for param in settings.params():
        if param.kind != "categorical":
            continue  # a range samples numbers only
        for choice in param.choices:
            try:
                data = layers([as_set(param.key, choice)])
            except ConfigError:
                continue
            yield data
