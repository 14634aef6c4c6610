"""``make_env``: one entry point that picks the fastest backend for an env id.

Backends:

* ``"native"``: a batched torch implementation from ``NATIVE_ENVS`` (fast, exact resume).
* ``"gymnasium"``: any Gymnasium id through ``GymVecEnv`` with ``SyncVectorEnv``.
* ``"gymnasium-async"``: the same with ``AsyncVectorEnv`` (one subprocess per env).
* ``"gymnasium-thread"``: the same, its envs stepped at once in one thread each, in this
  process (for env steps that wait with the GIL released; see
  :mod:`rlloop.envs.gym_threads`). Env runners honour it too: each steps its envs in
  threads.
* ``"envpool"``: Atari ids only, stepped by envpool's C++ thread pool (optional
  package; see :mod:`rlloop.envs.envpool_atari`).
* ``"auto"``: native when an implementation is registered for the id, else gymnasium.

Env ids: a native id, a registered Gymnasium id, an id of a known provider package
(``ALE/Pong-v5`` from ale_py, ``MiniGrid-Empty-5x5-v0`` from minigrid: imported on
demand when installed), or ``module:Id``, where importing ``module`` registers ``Id``
(see :func:`rlloop.envs.ids.resolve_env_id`, re-exported here).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import gymnasium
import torch

from rlloop.envs.core import EnvSpec, VecEnv
from rlloop.envs.envpool_atari import EnvpoolAtariVecEnv, check_envpool
from rlloop.envs.gym import GymVecEnv
from rlloop.envs.gym_spec import gym_env_spec
from rlloop.envs.ids import NATIVE_IDS, is_pettingzoo_id, resolve_env_id
from rlloop.envs.native.cartpole import CartPoleVecEnv
from rlloop.errors import EnvError

NativeFactory = Callable[..., VecEnv]
"""Called as ``factory(num_envs=..., seed=..., **env_kwargs)``, plus ``device=...`` when it
takes a ``device`` argument (needed for any device but the CPU). A factory that has a
class-level ``spec: EnvSpec`` (as a ``VecEnv`` class does) lets ``env_spec`` skip
making an instance."""

NATIVE_ENVS: dict[str, NativeFactory] = {"CartPole-v1": CartPoleVecEnv}

__all__ = ["BACKENDS", "NATIVE_ENVS", "env_spec", "is_pettingzoo_id", "make_env",
           "register_native", "resolve_env_id"]

BACKENDS = ("auto", "native", "gymnasium", "gymnasium-async", "gymnasium-thread",
            "envpool")


def register_native(env_id: str, factory: NativeFactory) -> None:
    """Make ``factory`` the native implementation of ``env_id`` (replacing any other)."""
    NATIVE_ENVS[env_id] = factory
    NATIVE_IDS.add(env_id)


def _resolve_backend(env_id: str, backend: str) -> str:
    """The concrete backend for ``env_id``, or ``EnvError`` with a one-line fix."""
    if backend not in BACKENDS:
        raise EnvError(
            f"unknown env backend {backend!r}; choose one of {', '.join(map(repr, BACKENDS))}"
        )
    resolve_env_id(env_id)
    if backend == "envpool":
        check_envpool(env_id)
    if backend == "auto":
        return "native" if env_id in NATIVE_ENVS else "gymnasium"
    if backend == "native" and env_id not in NATIVE_ENVS:
        raise EnvError(
            f"no native implementation of {env_id!r} (native ids: "
            f"{', '.join(sorted(NATIVE_ENVS))}); use backend='gymnasium' or 'auto'"
        )
    return backend


def _module_id_error(env_id: str, e: Exception) -> EnvError:
    """A "module:Env-v0" id whose module does not import or does not register the env."""
    if isinstance(e, ModuleNotFoundError) and e.name:
        reason = f"no module named {e.name!r}"
    else:
        reason = " ".join(str(e).split()) or type(e).__name__
    return EnvError(f"cannot make env {env_id!r}: {reason}; for a module:Env-v0 id the module "
                    "must be importable and register the env")


def _native_signature(env_id: str, factory: NativeFactory, num_envs: int, seed: int | None,
                      kwargs: dict[str, Any]) -> inspect.Signature:
    """The factory's signature, once ``kwargs`` are known to fit it (else ``EnvError``)."""
    signature = inspect.signature(factory)
    try:
        signature.bind(num_envs=num_envs, seed=seed, **kwargs)
    except TypeError as e:
        raise EnvError(
            f"native {env_id!r} does not accept env_kwargs {sorted(kwargs)} ({e}); "
            "drop them or use backend='gymnasium'"
        ) from None
    return signature


def make_env(
    env_id: str,
    num_envs: int = 1,
    backend: str = "auto",
    seed: int | None = None,
    env_kwargs: dict[str, Any] | None = None,
    device: str | torch.device = "cpu",
    step_timeout: float | None = 60.0,
) -> VecEnv:
    """``num_envs`` copies of ``env_id`` as one ``VecEnv`` (see the module docstring) whose
    tensors are on ``device``: native envs run there, Gymnasium envs step on the host and
    move each step's batch there.

    ``step_timeout``: seconds a gymnasium-async worker may take to answer (else
    ``EnvWorkerError``); the other backends step in-process and cannot time out.
    """
    kwargs = dict(env_kwargs or {})
    device = torch.device(device)
    if is_pettingzoo_id(env_id):
        raise EnvError(f"{env_id} is a multi-agent PettingZoo env; train it with a multi-agent "
                       f"algorithm: rlloop train ma_ppo --env {env_id}")
    resolved = _resolve_backend(env_id, backend)
    if resolved == "native":
        factory = NATIVE_ENVS[env_id]
        signature = _native_signature(env_id, factory, num_envs, seed, kwargs)
        if "device" in signature.parameters:
            kwargs["device"] = device
        elif device.type != "cpu":
            raise EnvError(
                f"native {env_id!r} takes no device argument, so it cannot run on {device}; "
                "add one to its factory or use backend='gymnasium'"
            )
        return factory(num_envs=num_envs, seed=seed, **kwargs)
    if resolved == "envpool":
        return EnvpoolAtariVecEnv(resolve_env_id(env_id), num_envs, seed=seed,
                                  env_kwargs=kwargs, device=device)
    try:
        return GymVecEnv(
            resolve_env_id(env_id),
            num_envs,
            seed=seed,
            asynchronous=resolved == "gymnasium-async",
            threads=resolved == "gymnasium-thread",
            env_kwargs=kwargs,
            device=device,
            step_timeout=step_timeout,
        )
    except (ImportError, gymnasium.error.UnregisteredEnv) as e:
        raise _module_id_error(env_id, e) from e


def env_spec(
    env_id: str, backend: str = "auto", env_kwargs: dict[str, Any] | None = None
) -> EnvSpec:
    """What ``make_env(env_id, backend=backend)`` would have as ``spec``, without stepping.

    Meant for validating a config before any env exists. Native envs with a class-level
    ``spec`` cost nothing; Gymnasium envs are made once and closed. For a PettingZoo id it
    is the first agent's view (``multi_agent_spec`` has every agent's).
    """
    if is_pettingzoo_id(env_id):
        from rlloop.envs.multi_agent import multi_agent_spec

        return multi_agent_spec(env_id, env_kwargs).summary()
    resolved = _resolve_backend(env_id, backend)
    if resolved == "envpool":
        pool = EnvpoolAtariVecEnv(resolve_env_id(env_id), 1, seed=0, env_kwargs=env_kwargs)
        pool.close()
        return pool.spec
    if resolved != "native":
        try:
            return gym_env_spec(resolve_env_id(env_id), env_kwargs)
        except (ImportError, gymnasium.error.UnregisteredEnv) as e:
            raise _module_id_error(env_id, e) from e
    factory = NATIVE_ENVS[env_id]
    spec = getattr(factory, "spec", None)
    if isinstance(spec, EnvSpec) and not env_kwargs:  # kwargs may change it (mask_velocity)
        return spec
    kwargs = env_kwargs or {}
    _native_signature(env_id, factory, 1, 0, kwargs)
    env = factory(num_envs=1, seed=0, **kwargs)
    try:
        return env.spec
    finally:
        env.close()
