"""User networks: ``policy=`` in the Python API, ``--set ppo.net=module:Class`` on the CLI.

A network is a class or factory called as ``factory(obs_shape)`` that returns a
``torch.nn.Module`` mapping observations ``[B, *obs_shape]`` (float32, not flattened) to
features ``[B, features_dim]``, with an int attribute ``features_dim``. rlloop builds one
for the actor and one for the critic and puts the heads on them (action logits or means,
the value; gSDE's noise acts on the actor's features).

The config names it as ``module:QualName`` so that a run's checkpoints load again. A
class defined in the running script (``__main__``) is remembered in this process; a
class in an importable module loads anywhere. Loading a saved run imports a module its
config names only with ``allow_import`` (as for env ids: ``rlloop.envs.imports``).
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from typing import Any

from torch import nn

from rlloop.config.network_choices import check_net_path as check_net_path
from rlloop.errors import ConfigError
from rlloop.system.user_code import import_user_module

NetFactory = Callable[[tuple[int, ...]], nn.Module]
#: What :func:`dotted_attribute` returns for a name the object does not have.
_MISSING = object()
#: Factories handed to the Python API in this process, by their ``module:QualName``.
_REGISTERED: dict[str, NetFactory] = {}


def net_path(factory: NetFactory | str) -> str:
    """The ``module:QualName`` of ``factory`` (remembered for :func:`resolve_net`)."""
    if isinstance(factory, str):
        return factory
    if not callable(factory):
        raise ConfigError(f"policy= must be a network class, a factory or 'module:Class', got "
                          f"{type(factory).__name__}")
    module, name = getattr(factory, "__module__", None), getattr(factory, "__qualname__", None)
    if not (isinstance(module, str) and isinstance(name, str)) or "<" in name:
        # A run directory names its network, for eval and resume in another process.
        raise ConfigError(f"policy= must be a class or function defined at the top level of "
                          f"a module (a saved run names it as module:Name), got {factory!r}; "
                          "define it with class/def at module level (give extra arguments "
                          "defaults there instead of functools.partial or a lambda)")
    path = f"{module}:{name}"
    _REGISTERED[path] = factory
    return path


def resolve_net(path: str, key: str) -> NetFactory:
    """The factory ``path`` names, importing its module (the caller has checked that a
    path read from a run directory may be imported)."""
    check_net_path(path, key)
    if path in _REGISTERED:
        check_factory(_REGISTERED[path], f"{key}={path!r}")
        return _REGISTERED[path]
    module, _, name = path.partition(":")
    obj = dotted_attribute(import_user_module(module, f"{key}={path!r}"), name)
    if is_missing(obj) and module == "__main__":
        raise ConfigError(f"{key}={path!r}: the network was defined in the script that "
                          f"trained the run, which this process is not; define {name} "
                          "and use rlloop.load(run) from Python, or move it to a module "
                          f"and train with {key}=module:{name}")
    if is_missing(obj):
        raise ConfigError(f"{key}={path!r}: module {module!r} has no {name!r}; check the "
                          "class name")
    if not callable(obj):
        raise ConfigError(f"{key}={path!r} is a {type(obj).__name__}, not a network class "
                          "or factory")
    check_factory(obj, f"{key}={path!r}")
    return obj  # type: ignore[no-any-return]


def check_factory(obj: object, label: str) -> None:
    """``ConfigError`` unless ``obj`` may be called as ``obj(obs_shape)`` to build a
    network: a ``torch.nn.Module`` subclass, or a function (or method) defined outside
    Python's standard library and builtins (what it returns is checked to be a module
    when it is built). A path such as ``os:system`` or ``builtins:eval`` would otherwise
    be called with the observation shape."""
    if isinstance(obj, type) and issubclass(obj, nn.Module):
        return
    fix = ("name a torch.nn.Module subclass or a function of your own that returns one "
           "(e.g. mynets:Encoder)")
    if isinstance(obj, type):
        raise ConfigError(f"{label} is a class but not a torch.nn.Module subclass; {fix}")
    function = obj.__func__ if inspect.ismethod(obj) else obj
    if not inspect.isfunction(function):  # C code (os.system, eval), a partial, an instance
        raise ConfigError(f"{label} is a {type(obj).__name__}, not a network class or "
                          f"factory function; {fix}")
    module = str(function.__module__)
    if module.partition(".")[0] in sys.stdlib_module_names:
        raise ConfigError(f"{label} is {module}.{function.__qualname__} from Python's "
                          f"standard library, not a network factory; {fix}")


def dotted_attribute(obj: object, name: str) -> Any:
    """``obj.a.b`` for ``name`` "a.b" (a ``QualName``), or :data:`_MISSING`."""
    for part in name.split("."):
        if not hasattr(obj, part):
            return _MISSING
        obj = getattr(obj, part)
    return obj


def is_missing(obj: object) -> bool:
    """Whether :func:`dotted_attribute` found nothing."""
    return obj is _MISSING


def script_nets(path: str | None, key: str) -> dict[str, NetFactory]:
    """``{path: factory}`` when ``path`` names a network of the running script
    (``__main__``), else ``{}``. Other processes (Ray's env runners) cannot import the
    script, so the factory travels to them (Ray pickles such classes by value) and
    :func:`register_nets` makes it known there."""
    if not path or path.partition(":")[0] != "__main__":
        return {}
    return {path: resolve_net(path, key)}


def register_nets(nets: dict[str, NetFactory]) -> None:
    """Make factories sent from another process resolvable here (see :func:`script_nets`)."""
    _REGISTERED.update(nets)


def registered_net(path: str) -> NetFactory | None:
    """The factory handed to this process under ``path`` (``policy=``), if any."""
    return _REGISTERED.get(path)

