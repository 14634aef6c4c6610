"""Which code an env id would import, so that loading a run never runs code it names.

Two id forms make Gymnasium or rlloop import a module by name: Gymnasium's
``"module:Env-v0"`` (``gymnasium.make`` imports ``module`` first) and rlloop's
``"pettingzoo:<name>"`` when ``<name>`` is not a module of PettingZoo itself (then
``<name>`` is imported as it stands). A config read from a run directory is untrusted
data: a run directory holding ``payload.py`` and ``env: "run.payload:Evil-v0"`` would run
the payload under ``rlloop eval run``. An id the user typed (``--env``, ``--config``) is
the user's own choice and may import what it names.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import sysconfig
import types
from typing import Any

from rlloop.envs.objects import check_object_env
from rlloop.errors import ConfigError, EnvError

PETTINGZOO_PREFIX = "pettingzoo:"


def module_to_import(env_id: str) -> str | None:
    """The module that making ``env_id`` imports by name, or None when it imports none.

    A module that is already imported runs no code when imported again, so it counts as
    none. PettingZoo's own modules (``pettingzoo:classic.tictactoe_v3``) are part of an
    installed package the user chose, not code a run directory can bring.
    """
    if env_id.startswith(PETTINGZOO_PREFIX):
        name = env_id[len(PETTINGZOO_PREFIX):]
        if _is_pettingzoo_module(name):
            return None
        module = name
    elif ":" in env_id:
        module = env_id.split(":", 1)[0]
    else:
        return None
    return None if module in sys.modules else module


def check_env_import(env_id: str, *, allow_import: bool, source: str) -> None:
    """Refuse an id from ``source`` (a run directory) that would import a module by name.

    Raises ``EnvError`` naming the module and the flag that allows it.
    """
    module = module_to_import(env_id)
    if module is None or allow_import:
        return
    raise EnvError(
        f"{source} names env {env_id!r}, which would import module {module!r}; loading a run "
        "never imports code it names: if you trust that module, pass --allow-import "
        "(Python: allow_import=True)"
    )


def check_saved_imports(saved: dict[str, Any], *, allow_import: bool, source: str) -> None:
    """Refuse a saved run config (``source``'s config.yaml) whose env id or network would
    import a module by name, unless ``allow_import``; torch-free, so the CLI refuses at once."""
    env = saved.get("env")
    if isinstance(env, str):
        check_env_import(env, allow_import=allow_import, source=source)
        check_object_env(env, source=source)
    algo = saved.get("algo", "ppo")
    section = saved.get(algo)
    net = section.get("net") if isinstance(section, dict) else None
    if isinstance(net, str):
        check_net_import(net, allow_import=allow_import, source=source, key=f"{algo}.net")


def check_net_import(path: str, *, allow_import: bool, source: str, key: str) -> None:
    """Refuse a network ``module:Class`` from ``source`` (a run directory's config) whose
    module is not imported yet, unless ``allow_import``: as for env ids. In a module that
    is imported already, it must name a network class (a ``torch.nn.Module`` subclass), a
    factory this process was given, or a class or function of the user's own code: a
    config naming ``builtins:print`` or ``os:system`` would otherwise call it."""
    module, _, name = path.partition(":")
    if not module or allow_import:
        return
    consent = ("loading a run never runs code it names: if you trust that module, pass "
               "--allow-import (Python: allow_import=True)")
    if module not in sys.modules:
        raise EnvError(f"{source} names network {key}={path!r}, which would import module "
                       f"{module!r}; {consent}")
    if not _a_network(module, name, path):
        raise EnvError(f"{source} names network {key}={path!r}, which is not a network "
                       f"class (a torch.nn.Module subclass) or a factory of your own code; "
                       f"{consent}")


def _a_network(module: str, name: str, path: str) -> bool:
    """Whether ``module:name`` (its module imported) is safe to call as a network factory:
    a ``torch.nn.Module`` subclass, a factory this process was given, or a class or
    function defined in the user's own code (the running script, or a module outside the
    interpreter's standard library and installed packages), never e.g. ``os:system``."""
    from torch import nn

    from rlloop.modules.custom import dotted_attribute, is_missing, registered_net

    if registered_net(path) is not None:
        return True
    obj = dotted_attribute(sys.modules[module], name)
    if is_missing(obj):
        return True  # nothing to call: resolving it fails with its own message
    if isinstance(obj, type) and issubclass(obj, nn.Module):
        return True
    defined_here = isinstance(obj, type | types.FunctionType) and getattr(
        obj, "__module__", None) == module
    return defined_here and (module == "__main__" or _users_module(module))


def _users_module(module: str) -> bool:
    """Whether ``module`` (imported) is a file outside the standard library and the
    installed packages: the user's own code (a module on PYTHONPATH or in the working
    directory)."""
    file = getattr(sys.modules[module], "__file__", None)
    if not file or module.partition(".")[0] == "rlloop":  # rlloop itself, even editable
        return False
    path = os.path.realpath(file)
    roots = {os.path.realpath(p) for key in ("stdlib", "platstdlib", "purelib", "platlib")
             if (p := sysconfig.get_paths().get(key))}
    return not any(path.startswith(root + os.sep) for root in roots)


def _is_pettingzoo_module(name: str) -> bool:
    if not name or name.startswith("."):
        return False
    try:
        return importlib.util.find_spec(f"pettingzoo.{name}") is not None
    except (ImportError, ValueError):  # PettingZoo absent, or a parent is not a package
        return False


#: Settings that make a run contact a server or write a store outside its directory: read
#: from a run directory (or a tuning study), they are used only when the user names them
#: again. Keys as ``--set`` takes them.
ENDPOINT_KEYS = ("mlflow_tracking_uri", "ray.address")


def saved_endpoints(data: dict[str, object]) -> dict[str, str]:
    """The endpoint settings a saved config (plain YAML data) sets, by ``--set`` key."""
    found = {}
    for key in ENDPOINT_KEYS:
        section, _, name = key.rpartition(".")
        holder = data.get(section) if section else data
        value = holder.get(name) if isinstance(holder, dict) else None
        if value is not None:
            found[key] = str(value)
    return found


def check_saved_endpoints(data: dict[str, object], *, source: str, restated: set[str],
                          consent: str) -> None:
    """Refuse endpoint settings read from ``source`` that the user did not name again
    (``restated``): a run directory never chooses where rlloop connects or writes.
    ``consent`` is how the user names one (e.g. ``--set {key}={value}``)."""
    for key, value in saved_endpoints(data).items():
        if key not in restated:
            raise ConfigError(
                f"{source} sets {key}={value!r}, which a resumed run would contact or write "
                f"to; a run directory never chooses where rlloop connects: if you trust it, "
                f"pass {consent.format(key=key, value=value)}"
            )
