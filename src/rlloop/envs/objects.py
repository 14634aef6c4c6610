"""Gymnasium env instances and factories as env ids, for the Python API.

Everything in rlloop names its env by id (the config, the run directory, every env the
run makes), so a factory or an instance is registered in Gymnasium's registry under a
generated id (``<Name>-rlloop<k>-v0``) for the life of the process. An instance is
copied (``copy.deepcopy``) for each env made from it. The registration lives in this
process only: a run of such an env cannot be resumed or evaluated by the CLI or another
process unless the env is registered again (``rlloop.load(run, env=factory)``).
"""

from __future__ import annotations

import copy
import itertools
import re
from collections.abc import Callable
from typing import Any

import gymnasium

from rlloop.errors import EnvError

_GENERATED = re.compile(r"-rlloop\d+-v0$")
_counter = itertools.count(1)


def env_id_of(env: Any) -> str:
    """``env`` itself when it is an id; a generated id registered for a factory or an
    instance of ``gymnasium.Env``."""
    if isinstance(env, str):
        return env
    if isinstance(env, gymnasium.Env):
        spec = env.spec
        name = type(env.unwrapped).__name__
        threshold = None if spec is None else spec.reward_threshold
        return register_object_env(copies_of(env), name, threshold)
    if callable(env):
        return register_object_env(env, getattr(env, "__name__", type(env).__name__),
                                   reward_threshold_of(env))
    raise EnvError(f"env must be an env id, a gymnasium.Env or a function returning one, got "
                   f"{type(env).__name__}")


def register_object_env(factory: Callable[..., Any], name: str,
                        reward_threshold: float | None = None,
                        env_id: str | None = None) -> str:
    """Register ``factory`` under ``env_id`` (default: a new generated id); returns the id."""
    if env_id is None:
        stem = re.sub(r"[^A-Za-z0-9_]", "", name) or "Env"
        env_id = next(i for i in (f"{stem}-rlloop{k}-v0" for k in _counter)
                      if i not in gymnasium.registry)
    gymnasium.register(env_id, entry_point=factory, reward_threshold=reward_threshold)
    return env_id


def reward_threshold_of(factory: Callable[..., Any]) -> float | None:
    """The solve threshold of the env ``factory`` makes (its spec's, as for an instance),
    read from one env made and closed here; None when it has none or cannot be made now
    (the run then reports the factory's error)."""
    try:
        probe = factory()
    except Exception:
        return None
    try:
        spec = getattr(probe, "spec", None)
        return None if spec is None else spec.reward_threshold
    finally:
        close = getattr(probe, "close", None)
        if callable(close):
            close()


def copies_of(env: gymnasium.Env[Any, Any]) -> Callable[..., gymnasium.Env[Any, Any]]:
    """The factory an instance is registered with: each env a copy of ``env``."""
    return lambda **kwargs: _copy_of(env, kwargs)


def _copy_of(env: gymnasium.Env[Any, Any], kwargs: dict[str, Any]) -> gymnasium.Env[Any, Any]:
    if kwargs:
        raise EnvError(f"an env instance takes no env_kwargs (got {sorted(kwargs)}); pass a "
                       "function that makes the env instead (for videos, one taking "
                       "render_mode: lambda render_mode=None: gymnasium.make(ID, "
                       "render_mode=render_mode)), or save_video=False")
    return copy.deepcopy(env)


def is_object_env(env_id: str) -> bool:
    """Whether ``env_id`` was generated for a factory or an instance."""
    return bool(_GENERATED.search(env_id))


def check_object_env(env_id: str, *, source: str) -> None:
    """EnvError when ``env_id`` names a factory or instance not registered in this process."""
    if is_object_env(env_id) and env_id not in gymnasium.registry:
        raise EnvError(f"{source} was trained on an env object passed to the Python API "
                       f"(registered as {env_id!r} in that process only), so the CLI cannot "
                       "remake it; in Python, load it with rlloop.load(run, env=<the same "
                       "env or factory>)")
