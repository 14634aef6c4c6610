"""The Python API's arguments (:mod:`rlloop.api`), checked before a run is built: the env,
``learn``'s count, paths and an offline model's dataset, each refused in one line that names
the fix (Stable-Baselines3's spellings translated). Torch-free."""

from __future__ import annotations

import re
import reprlib
from collections.abc import Mapping
from os import PathLike
from pathlib import Path
from typing import Any

from rlloop.config.loading import integer
from rlloop.config.offline import MINARI_PREFIX, dataset_env_id
from rlloop.errors import ConfigError

#: Stable-Baselines3's policy names (``PPO("MlpPolicy", env)``).
SB3_POLICY = re.compile(r"(Mlp|Cnn|MultiInput)(Lstm)?Policy")
NETS = ("an MLP for vectors, a CNN for images, one encoder per Dict entry; "
         "ppo.recurrent=lstm for memory")
#: What SB3's ``learn`` keywords are here.
LEARN_KEYWORDS = {
    "total_timesteps": "learn(total_env_steps)",
    "callback": "learn(n, callbacks=...)",
    "progress_bar": "the run setting progress (on by default; PPO(..., progress=False))",
    "log_interval": "the run settings eval_every and checkpoint_every (every iteration is "
                    "logged)",
    "reset_num_timesteps": "none: learn() continues the run; a new model starts a new one",
    "tb_log_name": "the run setting tensorboard=True (logs go to the run directory)",
}


def env_argument(name: str, env: Any, extra: tuple[Any, ...],
                  kwargs: dict[str, Any]) -> Any:
    """The constructor's env: the one positional argument or ``env=``; SB3's
    ``PPO("MlpPolicy", env)`` is refused naming rlloop's spelling."""
    keyword = kwargs.pop("env", None)
    given = [e for e in (env, *extra, keyword) if e is not None]
    if isinstance(env, str) and SB3_POLICY.fullmatch(env):
        rest = given[1:]
        shown = repr(rest[0]) if rest and isinstance(rest[0], str) else "env"
        raise ConfigError(f"{name}({env!r}, ...) is Stable-Baselines3's form; rlloop takes the "
                          f"env first and builds the network from the observation space "
                          f"({NETS}): {name}({shown}, ...)")
    if len(given) > 1:
        raise ConfigError(f"{name} takes one env (an id, a gymnasium.Env or a function "
                          f"returning one), positional or env=; got {len(given)}: "
                          f"{reprlib.repr(given)}")
    return given[0] if given else "CartPole-v1"


def learn_count(value: object, name: str, keywords: Mapping[str, Any]) -> int:
    """``learn``'s count ``name``: an integer > 0 (``1e5`` too, as the CLI takes it); its
    unknown ``keywords`` refused, with SB3's names translated."""
    if keywords:
        hints = "; ".join(f"Stable-Baselines3's {k} is "
                          f"{LEARN_KEYWORDS[k].replace('total_env_steps', name)} here"
                          for k in sorted(keywords) if k in LEARN_KEYWORDS)
        raise ConfigError(f"learn() got unknown arguments {sorted(keywords)}; "
                          f"{hints + '; ' if hints else ''}it takes {name} and callbacks")
    count = int(value) if isinstance(value, float) and value.is_integer() else integer(value)
    if count is None or count <= 0:
        raise ConfigError(f"{name} must be an integer > 0, got {value!r}")
    return count


def path_argument(value: object, what: str) -> Path:
    """``value`` as an absolute Path (``~`` expanded), or ConfigError naming ``what`` for
    anything that is no path."""
    try:
        return Path(value).expanduser().absolute()  # type: ignore[arg-type]
    except TypeError:
        raise ConfigError(f"{what} must be a path (str or os.PathLike), got {value!r} "
                          f"({type(value).__name__}); pass e.g. 'runs/my-run'") from None


def dataset_arguments(name: str, dataset: object, env: Any,
                      kwargs: Mapping[str, Any]) -> tuple[str, Any]:
    """An offline model's dataset (absolute unless ``minari:ID``) and env (by default the
    one the dataset was recorded in); the budget or the dataset given as a setting is
    refused (``learn`` counts the updates; the dataset comes first)."""
    for key in ("total_gradient_steps", "total_env_steps", "dataset"):
        if key in kwargs:
            fix = (f"{name}(dataset, ...) takes the dataset first" if key == "dataset" else
                   f"{name}(...).learn({kwargs[key]!r}) trains that many gradient updates")
            raise ConfigError(f"{key} is no setting of {name}(...): {fix}")
    if not isinstance(dataset, str | PathLike) or not str(dataset).strip():
        raise ConfigError(f"{name} needs a dataset, got {dataset!r}: {name}('data/DIR') (a "
                          f"directory `rlloop collect` wrote) or {name}('minari:ID')")
    text = str(dataset)
    if not text.startswith(MINARI_PREFIX):  # absolute: a later os.chdir keeps it
        text = str(path_argument(dataset, "dataset"))
    if env is None:
        env = dataset_env_id(text)
        if env is None:
            raise ConfigError(f"dataset {dataset} names no env; pass the env its policy is "
                              f"evaluated in: {name}({str(dataset)!r}, ENV_ID)")
    return text, env
