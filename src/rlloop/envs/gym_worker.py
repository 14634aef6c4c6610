"""The process side of the gymnasium-async backend: one Gymnasium env per process.

Gymnasium's ``AsyncVectorEnv`` starts this in place of its own worker (its ``worker``
argument); the parent side is :mod:`rlloop.envs.gym_async`. It differs from Gymnasium's
worker where robustness needs it:

* it dies with its parent: a kernel parent-death signal (Linux) and a thread watching
  the parent's sentinel, so a SIGKILLed trainer leaves no env process behind;
* it ignores ``SIGINT`` (Ctrl-C reaches the whole process group; the parent decides
  when workers stop) and takes ``SIGTERM``'s default action, so ``terminate()`` works;
* errors go back over the pipe as ``((type name, message, traceback), False)``, not
  through a queue, and the worker exits after one (its env may be broken);
* a reset answers ``(obs, mask)`` and a step ``(obs, reward, terminated, truncated,
  final_obs, mask, final_mask)`` with same-step autoreset (``final_obs`` is None unless
  the episode ended); of the info dicts only ``action_mask`` travels (``mask``, None
  where the env gives none), the one entry rlloop reads.

Torch-free on purpose, and outside ``rlloop.envs`` (whose package imports torch): a
worker imports only this module and what the env needs.
"""

from __future__ import annotations

import contextlib
import ctypes
import signal
import sys
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from rlloop.system.seeding import seed_host_rngs
from rlloop.system.worker_loop import exit_with_parent

_PR_SET_PDEATHSIG = 1


def gym_worker(index: int, env_fn: Callable[[], Any], pipe: Connection,
               parent_pipe: Connection, shared_memory: Any, error_queue: Any,
               autoreset_mode: Any = None, semaphore: Any = None) -> None:
    """Serve one env until "close", an error, or the parent's death. The signature is
    Gymnasium's worker signature; ``shared_memory``, ``error_queue``, ``autoreset_mode``
    and ``semaphore`` are unused (no shared memory, errors over the pipe, same-step
    autoreset always, no concurrency limit)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    die_with_parent()
    parent_pipe.close()
    env = None
    try:
        env = env_fn()
        while True:
            command, data = pipe.recv()
            if command == "close":
                pipe.send((None, True))
                return
            pipe.send((_run(env, command, data), True))
    except (EOFError, OSError):
        return  # the parent closed its end
    except BaseException:
        kind, value, _ = sys.exc_info()
        with contextlib.suppress(OSError):
            pipe.send(((getattr(kind, "__name__", "Exception"), str(value),
                        traceback.format_exc()), False))
    finally:
        if env is not None:
            with contextlib.suppress(Exception):  # best effort: the worker is going away
                env.close()


def _mask(info: Any) -> Any:
    return info.get("action_mask") if isinstance(info, dict) else None


def _run(env: Any, command: str, data: Any) -> Any:
    if command == "reset":
        if data.get("seed") is not None:
            # The process's own global RNGs (an env drawing from np.random), seeded as
            # the env is: a run is reproducible (a resume continues them afresh).
            seed_host_rngs(int(data["seed"]))
        obs, info = env.reset(**data)
        return obs, _mask(info)
    if command == "step":
        obs, reward, terminated, truncated, info = env.step(data)
        final_obs = final_mask = None
        if terminated or truncated:
            final_obs, final_mask = obs, _mask(info)
            obs, info = env.reset()
        return obs, reward, terminated, truncated, final_obs, _mask(info), final_mask
    if command == "_call":
        name, args, kwargs = data
        attr = env.get_wrapper_attr(name)
        return attr(*args, **kwargs) if callable(attr) else attr
    if command == "_setattr":
        name, value = data
        env.set_wrapper_attr(name, value)
        return None
    if command == "_check_spaces":
        _, obs_space, action_space = data
        return obs_space == env.observation_space, action_space == env.action_space
    raise RuntimeError(f"unknown command {command!r}")


def die_with_parent(signum: int = signal.SIGKILL) -> None:
    """Exit when the parent dies, even while an env step hangs.

    The kernel's parent-death signal (``signum``; SIGTERM lets a process that handles it
    stop in order) fires even if this process is stuck in C code holding the GIL; its
    "parent" is the process that forked this one (the forkserver, which exits with the
    trainer). The sentinel thread covers other platforms.
    """
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signum)
    exit_with_parent()
