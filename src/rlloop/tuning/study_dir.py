"""A study's directory before its first trial: a new study's settings checked, a saved
study's read back and trusted only as far as the user allows.

Everything a trial will need (config keys, one point of every searched key, the env, the
algorithm fitting it) is checked before anything is written, so bad input leaves no study
behind; the study that then runs its trials is :mod:`rlloop.tuning.study`.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlloop.config.loading import build_config, load_yaml
from rlloop.config.registry import ALGORITHMS, unknown_algorithm
from rlloop.config.run_config import RunConfig
from rlloop.envs.imports import check_env_import
from rlloop.errors import ConfigError, RunDirError
from rlloop.system.run_files import STUDY_FILE, write_file
from rlloop.tuning.settings import TuneSettings, load_settings
from rlloop.tuning.space import as_set, default_space, load_space, space_data
from rlloop.tuning.trust import check_saved_study, check_study_links

_SETTINGS = STUDY_FILE


def default_tune_dir(algo: str, env: str) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    env = re.sub(r"[^\w.-]+", "-", env)  # one path component, as default_run_dir does
    return Path("runs") / f"tune-{algo}-{env}-{stamp}"


def prepare(algo: str | None, env: str | None, *, trials: int | None, run_dir: str | None,
            resume: str | None, space_file: str | None, config_file: str | None,
            sets: Sequence[str], flags: dict[str, Any], startup_trials: int,
            warmup_evals: int, allow_import: bool = False) -> tuple[Path, TuneSettings]:
    """The tune directory and its settings: saved ones for a study that exists (``resume``,
    or a ``run_dir`` holding one), else new ones from the arguments. Checks everything a
    trial will need (config keys, the space, the env) before anything is written.

    A saved study is untrusted data: settings of it that the user did not type again
    (all of them with ``resume``) may import a module or name an endpoint only with
    ``allow_import`` (see `rlloop.tuning.trust`). No member of the study may be a link.
    """
    path = Path(resume or run_dir or default_tune_dir(algo or "ppo", env or "CartPole-v1"))
    if path.is_dir():
        check_study_links(path)
    saved = path / _SETTINGS
    if not saved.is_file() and (path / "config.yaml").is_file():
        raise RunDirError(f"{path} holds a training run, not a study; tune in another "
                          "--run-dir")
    if resume and not saved.is_file():
        raise RunDirError(f"{path} holds no rlloop study (no {_SETTINGS}); pass a directory "
                          "made by `rlloop tune`, or start one with --run-dir")
    if saved.is_file():
        settings = load_settings(path)
        if algo and algo != settings.algo:
            raise ConfigError(f"{path} is a {settings.algo} study, not {algo}; use "
                              f"`rlloop tune --resume {path}` or another --run-dir")
        if not resume and _changed(path, settings, env, space_file, config_file, sets, flags):
            raise ConfigError(f"{path} already holds a study of {settings.algo} on "
                              f"{settings.env} with other settings; continue it with `rlloop "
                              f"tune --resume {path}` (only --trials may change) or pick "
                              "another --run-dir")
        _trust_saved(path, settings, resume=bool(resume), typed_env=env is not None,
                     allow_import=allow_import)
        if trials is not None:
            settings.trials = trials
        return path, settings
    if algo is None:
        raise ConfigError("tune needs an algorithm, e.g. `rlloop tune ppo --env CartPole-v1` "
                          "(or --resume DIR)")
    if algo not in ALGORITHMS:
        raise ConfigError(unknown_algorithm(algo))
    space = load_space(space_file) if space_file else default_space(algo)
    env_id = env or build_config(algo, None, file=config_file).env
    settings = TuneSettings(algo, env_id, trials if trials is not None else 20,
                            space_data(space), list(sets), dict(flags), startup_trials,
                            warmup_evals, int(flags.get("seed") or 0))
    _check(settings, config_file)
    path.mkdir(parents=True, exist_ok=True)
    if config_file:
        write_file(path / "base.yaml", Path(config_file).read_bytes())
    return path, settings


def _trust_saved(path: Path, settings: TuneSettings, *, resume: bool, typed_env: bool,
                 allow_import: bool) -> None:
    """Check the saved settings of the study in ``path`` that the user did not type again:
    all of them when resuming; else only the env, when --env was left out (the rerun of a
    study's command line matches the rest). With ``allow_import``, import the env's module
    now, from the working directory too, as for an id typed to `rlloop tune`."""
    if resume:
        check_saved_study(path, settings, allow_import=allow_import)
    elif not typed_env:
        check_env_import(settings.env, allow_import=allow_import, source=str(path))
    if allow_import:
        from rlloop.envs.ids import resolve_env_id

        resolve_env_id(settings.env, allow_import=True, search_cwd=True)


def _changed(path: Path, saved: TuneSettings, env: str | None, space_file: str | None,
             config_file: str | None, sets: Sequence[str], flags: dict[str, Any]) -> bool:
    """Whether a rerun's arguments differ from those that started the study in ``path``
    (the same command line run again continues the study)."""
    space = space_data(load_space(space_file) if space_file else default_space(saved.algo))
    base = path / "base.yaml"
    return ((env is not None and env != saved.env) or space != saved.space
            or list(sets) != saved.sets or flags != saved.flags
            or (load_yaml(config_file) if config_file else None)
            != (load_yaml(base) if base.is_file() else None))


def _check(settings: TuneSettings, config_file: str | None) -> None:
    """The base config and one point of the space build; ``ConfigError`` names the key."""
    if settings.trials <= 0:
        raise ConfigError(f"--trials must be > 0, got {settings.trials}")
    base = build_config(settings.algo, settings.env, file=config_file, flags=settings.flags,
                        sets=settings.sets)
    for param in settings.params():
        for value in param.examples():
            try:
                build_config(settings.algo, settings.env, file=config_file,
                             flags=settings.flags, sets=[*settings.sets, as_set(param.key, value)])
            except ConfigError as e:
                raise ConfigError(f"search space key {param.key}: {e}") from None
    from rlloop.runs.preflight import check_fit  # imports torch: after the checks that need none

    check_fit(fit_batch(base))  # the algorithm fits the env, the device is there


def fit_batch(config: RunConfig) -> RunConfig:
    """A PPO minibatch larger than the rollout batch becomes the batch (as rl-zoo clamps
    batch_size to n_steps), so sampled combinations of the two always train."""
    hp = config.hparams
    if hasattr(hp, "minibatch_size") and hasattr(hp, "rollout_steps"):
        hp.minibatch_size = min(hp.minibatch_size, hp.rollout_steps * config.num_envs)
    return config
