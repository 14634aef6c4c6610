"""Batched environments: the ``VecEnv`` interface, native torch envs, Gymnasium adapter.

Names are imported on first use (PEP 562): `rlloop.envs.ids` checks an env id without
torch, and importing it must not bring torch along with this package.

May import: ``rlloop.errors``, ``system`` and ``config``; the networks above it only to
check a network a user module names (``imports``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlloop.envs.core import Box, Discrete, EnvSpec, StepResult, VecEnv
    from rlloop.envs.gym import GymVecEnv
    from rlloop.envs.native.cartpole import CartPoleVecEnv
    from rlloop.envs.registry import NATIVE_ENVS, env_spec, make_env, register_native
    from rlloop.errors import EnvError

_MODULES = {
    "Box": "core", "Discrete": "core", "EnvError": "core", "EnvSpec": "core",
    "StepResult": "core", "VecEnv": "core", "GymVecEnv": "gym",
    "CartPoleVecEnv": "native.cartpole", "NATIVE_ENVS": "registry", "env_spec": "registry",
    "make_env": "registry", "register_native": "registry",
}


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        return getattr(importlib.import_module(f"{__name__}.{_MODULES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "NATIVE_ENVS",
    "Box",
    "CartPoleVecEnv",
    "Discrete",
    "EnvError",
    "EnvSpec",
    "GymVecEnv",
    "StepResult",
    "VecEnv",
    "env_spec",
    "make_env",
    "register_native",
]
