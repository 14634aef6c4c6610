"""Where a run starts: `train` a new one, `resume` a saved one.

Each is a short sequence: check the run directory, build the config (a resume's from its
saved one, changed only where a resume may change it), then a :class:`Session` runs it
(again from the newest checkpoint if its learner group breaks). The CLI's ``train`` and
the Python API's ``learn`` both come here.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlloop.config.loading import build_config, load_yaml, parse_set
from rlloop.config.run_config import RunConfig, resumable
from rlloop.envs.imports import check_saved_endpoints, saved_endpoints
from rlloop.errors import ConfigError
from rlloop.learners.process_group import LearnerGroupError
from rlloop.runs.lock import ensure_free
from rlloop.runs.run_dir import (
    claimed_default_run_dir,
    has_checkpoint,
    no_checkpoint_error,
    refuse_existing_run,
)
from rlloop.runs.saved import load_run_config
from rlloop.runs.session import Session
from rlloop.system.run_files import check_run_dir, refuse_study_dir
from rlloop.trainers.callbacks import Callback
from rlloop.trainers.result import RunResult

_log = logging.getLogger(__name__)


def train(config: RunConfig, run_dir: str | Path | None = None, *,
          console: Any = None, callbacks: Sequence[Callback] = (),
          started_at: float | None = None) -> RunResult:
    """Start a new run in ``run_dir`` (default ``runs/<algo>-<env>-<time>``).

    ``started_at`` (``time.time()``, default now) is when start-up began (``time/startup_s``),
    e.g. the process's start for the CLI."""
    if not run_dir:
        with claimed_default_run_dir(config) as path:
            return _run_session(config, path, resume=False, console=console,
                                callbacks=callbacks, started_at=started_at)
    path = Path(run_dir)
    refuse_study_dir(path)
    if (path / "config.yaml").exists():
        ensure_free(path)  # a live trainer holds it: name its PID instead
        if not has_checkpoint(path):  # then "resume it" would only send the user back here
            raise no_checkpoint_error(path)
    refuse_existing_run(path, other_files=True)
    return _run_session(config, path, resume=False, console=console, callbacks=callbacks,
                        started_at=started_at)


def _run_session(config: RunConfig, path: Path, *, resume: bool, console: Any,
                 callbacks: Sequence[Callback], started_at: float | None) -> RunResult:
    """A session; when its learner group breaks, again from the newest checkpoint, up to
    ``max_learner_restarts`` times."""
    restarts = 0
    while True:
        try:
            return Session(config, path, resume=resume, console=console,
                           callbacks=callbacks, started_at=started_at).run()
        except LearnerGroupError as e:
            if restarts >= config.max_learner_restarts or not has_checkpoint(path):
                raise
            restarts += 1
            resume = True
            _log.warning("%s; restarting the learners from the newest checkpoint (restart "
                         "%d of %d)", str(e).split(";")[0], restarts,
                         config.max_learner_restarts)


def resume_config(run_dir: str | Path, *, allow_import: bool = False, env: str | None = None,
                  file: str | Path | None = None, sets: list[str] | None = None,
                  **flags: Any) -> RunConfig:
    """A run's saved config with the overrides a resume may apply (see
    :func:`rlloop.config.run_config.resumable`); ``ConfigError`` names any other changed setting."""
    saved = load_run_config(run_dir, allow_import=allow_import)
    old = saved.to_dict()
    config = build_config(saved.algo, env, file=file, flags=flags, sets=sets, base=old)
    new = config.to_dict()
    changed = [f"{key}.{sub}" for key, value in new.items()
               if isinstance(value, dict) and key != "env_kwargs"
               for sub in value if value[sub] != (old.get(key) or {}).get(sub)]
    changed += [key for key, value in new.items()
                if not (isinstance(value, dict) and key != "env_kwargs") and value != old[key]]
    fixed = [key for key in changed if not resumable(key, saved.algo)]
    if fixed:
        raise ConfigError(f"a resumed run cannot change {', '.join(fixed)} (a resume "
                          "continues the run as it was set up: its env, networks, optimisers "
                          "and data follow its settings); drop the override or start a new "
                          "run. A resume may change budgets, stop rules, evaluation, "
                          "checkpoint and logging settings")
    return config


def resume(run_dir: str | Path, *, console: Any = None, allow_import: bool = False,
           env: str | None = None, file: str | Path | None = None,
           sets: list[str] | None = None, callbacks: Sequence[Callback] = (),
           started_at: float | None = None, **flags: Any) -> RunResult:
    """Continue a run from its last checkpoint with its saved config, changed by the
    overrides a resume allows (``flags``, ``--set`` items, a YAML ``file``); ``started_at``
    as for `train`."""
    ensure_free(check_run_dir(run_dir))  # fail fast if a trainer holds it
    config = resume_config(run_dir, allow_import=allow_import, env=env, file=file, sets=sets,
                           **flags)
    _check_endpoints(Path(run_dir), config, file=file, sets=sets, flags=flags)
    if not has_checkpoint(Path(run_dir)):  # before Session starts envs and sinks
        raise no_checkpoint_error(Path(run_dir))
    return _run_session(config, Path(run_dir), resume=True, console=console,
                        callbacks=callbacks, started_at=started_at)


def _check_endpoints(run_dir: Path, config: RunConfig, *, file: str | Path | None,
                     sets: list[str] | None, flags: dict[str, Any]) -> None:
    """Refuse a server or outside store that the run's saved config names (its MLflow
    tracking URI, its Ray address) unless the user names it again for this resume: a
    copied run directory would otherwise send the user's credentials, and the run's
    files, wherever it says."""
    saved = load_yaml(run_dir / "config.yaml")
    if not config.mlflow:  # no store is opened
        saved.pop("mlflow_tracking_uri", None)
    restated = {parse_set(item)[0] for item in sets or []}
    restated |= set(saved_endpoints(load_yaml(file) if file else {}))
    restated |= set(saved_endpoints({k: v for k, v in flags.items() if v is not None}))
    check_saved_endpoints(saved, source=str(run_dir), restated=restated,
                          consent="--set {key}={value} (Python: the same setting to load())")
