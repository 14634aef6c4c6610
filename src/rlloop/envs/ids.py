"""Env ids checked without importing torch: ``resolve_env_id`` and the provider list.

The CLI resolves a typed ``--env`` here before torch's second of import, so a mistyped id
answers at once; `rlloop.envs.registry` re-exports these names beside ``make_env``.
"""

from __future__ import annotations

import difflib
import importlib
import os
import re
import sys
from typing import NamedTuple

import gymnasium

from rlloop.errors import EnvError

PETTINGZOO_PREFIX = "pettingzoo:"

#: Ids with a native implementation (`rlloop.envs.registry.NATIVE_ENVS` holds their
#: factories; ``register_native`` adds to both).
NATIVE_IDS: set[str] = {"CartPole-v1"}


def is_pettingzoo_id(env_id: str) -> bool:
    return env_id.startswith(PETTINGZOO_PREFIX)


class Provider(NamedTuple):
    """A package that registers Gymnasium envs when imported."""

    pattern: str
    """Regex matched at the start of the ids it provides."""
    module: str
    pip: str
    """What to ``pip install``."""


#: The only modules rlloop imports on its own to find an id (if installed): a fixed list,
#: so no config can make it import arbitrary code. Gymnasium 1.x has no plugin hook, and
#: these packages register their ids only when imported.
ENV_PROVIDERS: tuple[Provider, ...] = (
    Provider(r"ALE/", "ale_py", "ale-py"),
    Provider(r"[A-Z]\w*NoFrameskip-v[04]$", "ale_py", "ale-py"),  # the v0/v4 Atari ids
    Provider(r"(MiniGrid|BabyAI)-", "minigrid", "minigrid"),
    Provider(r"MiniWorld-", "miniworld", "miniworld"),
    Provider(r"(Fetch|HandManipulate|HandReach|Adroit|PointMaze_|AntMaze_|FrankaKitchen)",
             "gymnasium_robotics", "gymnasium-robotics"),
)


def resolve_env_id(env_id: str, *, allow_import: bool = False, search_cwd: bool = False) -> str:
    """The id to pass to ``gymnasium.make`` for ``env_id``, or ``EnvError`` with the fix.

    A known provider's module (``ENV_PROVIDERS``) is imported when the id needs it and the
    package is installed; the returned id names it (``ale_py:ALE/Pong-v5``) so that
    subprocess envs import it too. In a ``module:Id`` id, ``module`` is imported only with
    ``allow_import`` (the user typed the id, or consented for a run's id); without it the
    module must already be imported or be a known provider, so an id read from a run
    directory never runs code of its choosing. ``search_cwd`` (only for an id the user
    typed) also searches the working directory, as ``python -m`` does.
    """
    if env_id in NATIVE_IDS or is_pettingzoo_id(env_id):
        return env_id
    module, sep, name = env_id.partition(":")
    if not sep:
        module, name = "", env_id
    provider = _provider(name)
    if module:
        _import_env_module(env_id, module, allow_import, search_cwd, provider)
    elif provider is not None and _provider_importable(provider):
        module = provider.module
    if name not in gymnasium.registry:
        raise EnvError(_unknown_id(env_id, name, module, provider))
    return f"{module}:{name}" if module else name


def _provider_importable(provider: Provider) -> bool:
    """Import the provider's package; False when it is missing or its import fails (then
    the unknown-id error names the pip command)."""
    try:
        importlib.import_module(provider.module)
    except ImportError:
        return False
    return True


def _provider(name: str) -> Provider | None:
    return next((p for p in ENV_PROVIDERS if re.match(p.pattern, name)), None)


def _import_env_module(env_id: str, module: str, allow_import: bool, search_cwd: bool,
                       provider: Provider | None) -> None:
    known = provider is not None and provider.module == module
    if module in sys.modules:
        return
    if not (allow_import or known):
        raise EnvError(
            f"env id {env_id!r} needs module {module!r} imported, and rlloop imports a "
            f"module named in an env id only when you allow it (e.g. rlloop train --env "
            f"{env_id}); import {module} first"
        )
    if allow_import and search_cwd and os.getcwd() not in sys.path:
        # Console scripts, unlike ``python -m``, do not search the working directory,
        # where a user's env module usually is. Appended: it never shadows a package.
        sys.path.append(os.getcwd())
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as e:
        top = module.split(".")[0]
        if known and provider is not None:
            raise EnvError(f"env id {env_id!r} needs the {module} package: pip install "
                           f"{provider.pip}") from None
        if e.name is not None and (e.name == module or module.startswith(e.name + ".")):
            raise EnvError(
                f"env id {env_id!r}: no module named {module!r}; install it, or run rlloop "
                f"from the directory that holds {top}.py"
            ) from None
        raise EnvError(f"env id {env_id!r}: importing {module!r} failed ({e}); install what "
                       "it needs") from None


def _unknown_id(env_id: str, name: str, module: str, provider: Provider | None) -> str:
    if module and (provider is None or provider.module != module):
        return (f"unknown env id {env_id!r}: importing {module!r} registered no env "
                f"{name!r}; check the id it registers")
    if provider is not None:
        return (f"unknown env id {env_id!r}; it comes from the {provider.module} package: "
                f"pip install {provider.pip}")
    known = sorted({*gymnasium.registry.keys(), *NATIVE_IDS})
    close = difflib.get_close_matches(env_id, known, n=3)
    hint = (f"did you mean {' or '.join(map(repr, close))}?" if close
            else "see gymnasium.pprint_registry() for the registered ids")
    return f"unknown env id {env_id!r}; {hint} (or module:Id, where module registers Id)"


def check_registered(env_id: str, *, source: str) -> None:
    """``EnvError`` when a saved run's plain env id (``source`` names the run) is not
    registered in this process and no known package provides it: a user's module registers
    it, so say to import that module now, not at the first step of ``predict()``."""
    if env_id in NATIVE_IDS or is_pettingzoo_id(env_id) or ":" in env_id:
        return  # module:Id imports its module; the other two need no registration
    if env_id in gymnasium.registry or _provider(env_id) is not None:
        return  # a provider's id gets its own pip command when the env is made
    raise EnvError(f"{source} was trained on env {env_id!r}, which is not registered in "
                   "this process: import the module that registers it (gymnasium.register) "
                   "before loading the run")
