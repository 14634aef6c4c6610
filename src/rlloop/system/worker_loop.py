"""The env side of an env worker: a few envs stepped with autoreset, and the serve loop.

This module is torch-free on purpose and lives outside ``rlloop.envs`` (whose package
imports torch): a worker process imports only this module and whatever the env factory
needs, so starting or restarting one costs milliseconds instead of the seconds that
``import torch`` takes on a small machine. The parent side is :mod:`rlloop.envs.pool`.

Envs follow the Gymnasium API (``reset(seed=) -> (obs, info)``,
``step(action) -> (obs, reward, terminated, truncated, info)``); they do not have to
subclass ``gymnasium.Env``.

Messages, parent to worker: ``(seq, ops)`` with one op per env (an action, ``None`` for
"reset this env", or :class:`Reseed` for "reset it with this seed"), or ``None`` for
"close". Worker to parent: ``(seq, outcomes)``
or ``(seq, Crash)``; a worker that crashed stops serving.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import os
import signal
import threading
import traceback
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol

EnvFactory = Callable[[], Any]
"""Makes one Gymnasium-style env. Must be picklable for process workers: a module-level
function or class, or a ``functools.partial`` of one."""


class EnvOutcome(NamedTuple):
    """What one env reports when it is ready for its next action.

    Attributes:
        obs: Observation to act on. When an episode just ended this is already the first
            observation of the next one (same-step autoreset, as in ``rlloop.envs``).
        reward: Reward for the previous action (0 after a reset).
        terminated: The previous action ended the episode in a terminal state.
        truncated: The previous action ended the episode by a time limit (never together
            with ``terminated``).
        final_obs: Last observation of the episode that just ended; ``obs`` otherwise.
    """

    obs: Any
    reward: float
    terminated: bool
    truncated: bool
    final_obs: Any


class Crash(NamedTuple):
    """A worker failed: ``kind`` is "raised", "died" or "hung"; ``detail`` the traceback."""

    kind: str
    detail: str


class Reseed(NamedTuple):
    """The op "reset this env with ``seed``" (its RNG restarts from the seed)."""

    seed: int


class Channel(Protocol):
    """Both ends speak this: a ``multiprocessing`` connection, or a queue pair for threads."""

    def send(self, obj: Any) -> None: ...
    def recv(self) -> Any: ...


class EnvGroup:
    """The envs one worker owns. Env ``i`` is seeded with ``seeds[i]`` on its first reset."""

    def __init__(self, env_fn: EnvFactory, seeds: Sequence[int]) -> None:
        self.envs: list[Any] = []
        try:
            for _ in seeds:
                self.envs.append(env_fn())
        except BaseException:
            self.close()
            raise
        self._seeds: list[int | None] = list(seeds)

    def run(self, ops: Sequence[Any]) -> list[EnvOutcome]:
        """Apply one op per env: ``None`` resets it, a :class:`Reseed` resets it with that
        seed, anything else is its action."""
        return [self._reset(i) if op is None
                else self._reset(i, op.seed) if isinstance(op, Reseed)
                else self._step(i, op) for i, op in enumerate(ops)]

    def _reset(self, i: int, seed: int | None = None) -> EnvOutcome:
        if seed is None:  # the first reset takes the worker's seed; later ones continue
            seed, self._seeds[i] = self._seeds[i], None
        else:
            self._seeds[i] = None
        obs, _ = self.envs[i].reset(seed=seed)
        return EnvOutcome(obs, 0.0, False, False, obs)

    def _step(self, i: int, action: Any) -> EnvOutcome:
        obs, reward, terminated, truncated, _ = self.envs[i].step(action)
        terminated, truncated = bool(terminated), bool(truncated)
        if not (terminated or truncated):
            return EnvOutcome(obs, float(reward), False, False, obs)
        first, _ = self.envs[i].reset()
        # A terminal state needs no bootstrap, so it wins when both flags are set.
        return EnvOutcome(first, float(reward), terminated, truncated and not terminated, obs)

    def close(self) -> None:
        for env in self.envs:
            with contextlib.suppress(Exception):  # best effort: the worker is going away
                env.close()


def serve(channel: Channel, env_fn: EnvFactory, seeds: Sequence[int]) -> None:
    """Answer ``(seq, ops)`` messages until ``None`` arrives, the parent goes away, or an env
    fails (then the traceback is sent back and the loop ends: the env may be broken)."""
    group: EnvGroup | None = None
    try:
        while True:
            message = channel.recv()
            if message is None:
                return
            seq, ops = message
            try:
                if group is None:  # made here so that a failing factory is reported too
                    group = EnvGroup(env_fn, seeds)
                reply: Any = group.run(ops)
                channel.send((seq, reply))
            except Exception:
                channel.send((seq, Crash("raised", traceback.format_exc())))
                return
    except (EOFError, OSError):
        return  # the parent closed its end
    finally:
        if group is not None:
            group.close()


def process_main(conn: multiprocessing.connection.Connection, env_fn: EnvFactory,
                 seeds: Sequence[int]) -> None:
    """Entry point of a worker process."""
    # Ctrl-C reaches the whole process group; the parent decides when workers stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    exit_with_parent()
    serve(conn, env_fn, seeds)


def exit_with_parent() -> None:
    """Exit when the parent dies, even while an env step hangs (the pipe cannot tell us then)."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch() -> None:
        multiprocessing.connection.wait([parent.sentinel])
        os._exit(1)

    threading.Thread(target=watch, name="rlloop-parent-watch", daemon=True).start()
