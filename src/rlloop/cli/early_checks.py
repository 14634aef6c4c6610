"""What the commands check before torch is imported, so that input which cannot work is
refused in well under a second instead of after torch's import (several seconds on a
small machine): missing extras, an action space the algorithm cannot act in, a saved run
that would import code without ``--allow-import``, a run directory or video file that
cannot be written.
"""

from __future__ import annotations

import os
import tempfile
import warnings
from pathlib import Path
from typing import Any

from rlloop.config.appo import ASYNC_ALGOS
from rlloop.config.loading import load_yaml
from rlloop.config.registry import ALGORITHMS, action_space_refusal, algorithm_name
from rlloop.envs.ids import NATIVE_IDS, is_pettingzoo_id
from rlloop.envs.imports import check_saved_imports
from rlloop.errors import ConfigError, RunDirError
from rlloop.system.extras import require
from rlloop.system.run_files import check_output_file


def check_extras(settings: dict[str, Any]) -> None:
    """``ConfigError`` naming the extra for each optional package the run's merged settings
    (``config_layers``) ask for and that is not installed."""
    if settings.get("wandb") is True:
        require("wandb", "wandb=true")
    if settings.get("tensorboard") is True:
        require("tensorboard", "tensorboard=true")
    runners = settings.get("num_env_runners")
    if isinstance(runners, int) and runners > 0 and settings.get("algo") not in ASYNC_ALGOS:
        require("ray", f"num_env_runners={runners}")  # APPO's runners are local processes
    if settings.get("backend") == "envpool":
        require("envpool", "backend=envpool", instead="use backend=auto")


def check_action_space(algo: str, env_id: str, env_kwargs: Any) -> None:
    """``ConfigError`` when ``algo`` cannot act in a Gymnasium env's action space, read from
    one env made without torch. Only for the algorithms that take one kind of action: ppo
    takes every kind, so the main command makes no extra env."""
    entry = ALGORITHMS[algo]
    if (entry.discrete and entry.continuous) or env_id in NATIVE_IDS or is_pettingzoo_id(env_id):
        return
    import gymnasium

    kwargs = env_kwargs if isinstance(env_kwargs, dict) else {}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the run itself shows the env's warnings
            env = gymnasium.make(env_id, **kwargs)
            space = type(env.action_space).__name__
            env.close()
    except Exception:  # the run makes the env again and reports what is wrong in its words
        return
    refusal = action_space_refusal(algo, env_id, space)
    if refusal is not None:
        raise ConfigError(refusal)


def check_saved_run(run_dir: str, *, allow_import: bool) -> None:
    """The saved run's env id and network may not import a module without
    ``allow_import`` (``rlloop.runs.saved.load_run_config`` checks it again, with torch)."""
    path = Path(run_dir)
    if (path / "config.yaml").is_file():
        check_saved_imports(load_yaml(path / "config.yaml"), allow_import=allow_import,
                            source=str(path))


def algorithm_arg(text: str) -> str:
    """The registry's name for an algorithm typed in any case (``PPO`` -> ``ppo``)."""
    try:
        return algorithm_name(text)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def check_new_run_dir(raw: str | None) -> None:
    """RunDirError unless ``raw`` is a directory a run can be created in (checked without
    creating it, so bad input leaves nothing behind)."""
    if raw is None:
        return
    if not raw.strip():
        raise RunDirError("--run-dir is empty; pass a directory, or leave the flag out for "
                          "runs/<algo>-<env>-<time>")
    path = Path(raw)
    if path.exists() and not path.is_dir():
        raise RunDirError(f"--run-dir {raw} is an existing file, not a directory; pick "
                          "another --run-dir")
    base = path
    while not base.exists():
        base = base.parent
    if not base.is_dir():
        raise RunDirError(f"--run-dir {raw} cannot be created: {base} is a file; pick another "
                          "--run-dir")
    try:
        probe_writable(base)
    except OSError as e:
        raise RunDirError(f"--run-dir {raw} cannot be created in {base} ({e.strerror}); pick "
                          "a writable --run-dir") from None


def probe_writable(directory: Path) -> None:
    """``OSError`` unless something can be made in ``directory``: the only sure test of
    writability (root passes os.access checks on /proc)."""
    os.rmdir(tempfile.mkdtemp(prefix=".rlloop-", dir=directory))


def check_video_file(path: Path, run_dir: Path) -> None:
    """``--video``'s file, checked before the evaluation it follows: an MP4 (the encoder
    picks the format by suffix) in a writable directory, none of the run's own files."""
    if path.suffix.lower() != ".mp4":
        raise ConfigError(f"--video {path}: name an .mp4 file (e.g. {path.with_suffix('.mp4')})")
    check_output_file(path, [run_dir], option="--video")
    try:
        probe_writable(path.parent)
    except OSError as e:
        raise RunDirError(f"--video {path} cannot be written in {path.parent} ({e.strerror}); "
                          "pick a writable place") from None
