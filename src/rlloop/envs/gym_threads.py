"""Gymnasium's ``SyncVectorEnv`` with its sub-envs stepped at once, one thread each.

The ``"gymnasium-thread"`` backend. ``SyncVectorEnv`` steps its envs one after another,
so a batched step of N envs whose step waits (a simulator in C that releases the GIL, a
robot or game server over a socket, a sleep) takes N times one env's wait. Here each
sub-env steps (and, when its episode ends, resets) on a thread of its own and the batch
is assembled in env order afterwards, so the wait is paid once per batched step. Each
env keeps its own RNG and is only ever touched by one thread at a time, so results are
exactly those of ``SyncVectorEnv``. For pure-Python envs that hold the GIL the threads
only add overhead (a few microseconds per env and step): use ``"gymnasium"`` for those.

Only steps are threaded: ``reset()`` (at the start and at ``horizons_per_env_reset``)
stays sequential, as do attribute reads and writes (``get_state``).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, wait
from copy import deepcopy
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from gymnasium.vector.utils import concatenate, iterate

#: One sub-env's step: obs, reward, terminated, truncated, info, and the final
#: (obs, info) of an episode that ended in it (then ``obs`` starts the next one).
_Outcome = tuple[Any, float, bool, bool, dict[str, Any], tuple[Any, dict[str, Any]] | None]


def _step_one(env: Any, action: Any) -> _Outcome:
    obs, reward, terminated, truncated, info = env.step(action)
    final = None
    if terminated or truncated:  # same-step autoreset, as SyncVectorEnv does it
        final = (obs, info)
        obs, info = env.reset()
    return obs, reward, terminated, truncated, info, final


class _DaemonThreads:
    """A fixed pool of daemon threads running submitted calls (``ThreadPoolExecutor``'s
    ``submit``). ``ThreadPoolExecutor``'s threads are joined when the interpreter exits,
    so an env that hangs in ``step()`` kept the process alive after a second stop signal
    had interrupted the run and its checkpoint was written; a daemon thread is not."""

    def __init__(self, workers: int, name: str) -> None:
        self._calls: queue.SimpleQueue[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]]
                                       | None] = queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._work, name=f"{name}_{i}", daemon=True)
                         for i in range(workers)]
        for thread in self._threads:
            thread.start()

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        future: Future[Any] = Future()
        self._calls.put((future, fn, args))
        return future

    def shutdown(self, wait: bool = True) -> None:
        for _ in self._threads:
            self._calls.put(None)
        if wait:
            for thread in self._threads:
                thread.join()

    def _work(self) -> None:
        while (call := self._calls.get()) is not None:
            future, fn, args = call
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args))
            except BaseException as e:  # handed to the waiting thread, as an executor does
                future.set_exception(e)


class ThreadedVectorEnv(SyncVectorEnv):
    """``SyncVectorEnv`` (same-step autoreset) whose ``step`` runs the sub-envs in
    ``num_envs`` threads; see the module doc."""

    def __init__(self, env_fns: Sequence[Callable[[], Any]]) -> None:
        super().__init__(env_fns, autoreset_mode=AutoresetMode.SAME_STEP)
        self._threads = _DaemonThreads(self.num_envs, "rlloop-env")
        self._stepping: list[Future[Any]] = []  # the steps of the latest call

    def step(self, actions: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        futures = [self._threads.submit(_step_one, env, action) for env, action in
                   zip(self.envs, iterate(self.action_space, actions), strict=True)]
        self._stepping = futures
        # Every env finishes its step before one that raised re-raises here: none is
        # left stepping while the caller handles the error.
        wait(futures)
        outcomes = [f.result() for f in futures]
        infos: dict[str, Any] = {}
        for i, (obs, reward, terminated, truncated, info, final) in enumerate(outcomes):
            self._env_obs[i] = obs
            self._rewards[i], self._terminations[i], self._truncations[i] = (
                reward, terminated, truncated)
            if final is not None:
                infos = self._add_info(infos, {"final_obs": final[0], "final_info": final[1]},
                                       i)
            infos = self._add_info(infos, info, i)
        self._observations = concatenate(self.single_observation_space, self._env_obs,
                                         self._observations)
        self._autoreset_envs = np.logical_or(self._terminations, self._truncations)
        return (deepcopy(self._observations) if self.copy else self._observations,
                np.copy(self._rewards), np.copy(self._terminations),
                np.copy(self._truncations), infos)

    def close_extras(self, **kwargs: Any) -> None:
        threads = getattr(self, "_threads", None)  # None: __init__ failed
        if threads is None:
            super().close_extras(**kwargs)
            return
        # A step a stop signal interrupted may never end (an env hung in step()): the
        # envs still stepping are left to it, never closed from this thread under it.
        busy = {i for i, future in enumerate(self._stepping) if not future.done()}
        threads.shutdown(wait=not busy)
        for i, env in enumerate(self.envs):
            if i not in busy:
                env.close()
