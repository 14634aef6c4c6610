"""What the commands check before torch is imported, so that input which cannot work is
refused in well under a second instead of after torch's import (several seconds on a
small machine): missing extras, an action space the algorithm cannot act in, a saved run
that would import code without ``--allow-import``.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from rlloop.config.loading import load_yaml
from rlloop.config.registry import ALGORITHMS, action_space_refusal
from rlloop.envs.ids import NATIVE_IDS, is_pettingzoo_id
from rlloop.envs.imports import check_saved_imports
from rlloop.errors import ConfigError
from rlloop.system.extras import require


def check_extras(settings: dict[str, Any]) -> None:
    """``ConfigError`` naming the extra for each optional package the run's merged settings
    (``config_layers``) ask for and that is not installed."""
    if settings.get("wandb") is True:
        require("wandb", "wandb=true")
    if settings.get("tensorboard") is True:
        require("tensorboard", "tensorboard=true")
    runners = settings.get("num_env_runners")
    if isinstance(runners, int) and runners > 0:
        require("ray", f"num_env_runners={runners}")
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
