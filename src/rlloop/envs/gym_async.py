"""Gymnasium's ``AsyncVectorEnv`` made safe to train on: no wait without a bound.

Gymnasium's version blocks forever on a worker that hangs or dies, shuts a worker down
for any failed attribute read, and joins its processes without a timeout. This subclass
keeps its process start-up, spaces and senders and replaces every receive:

* each answer has a deadline (``step_timeout``; the first one after start-up, which
  includes making the env, gets ``START_TIMEOUT_S`` more); a worker that raises, dies
  (a segfault) or misses its deadline raises :class:`EnvWorkerError`, one line naming
  the env, the worker and what happened (a raised exception's traceback is logged);
* a stop signal (see :mod:`rlloop.system.signals`) makes a wait give up with
  :class:`~rlloop.system.signals.StopInterrupted` once no worker has answered for
  ``STOP_GRACE_S`` seconds past the signal: a hung worker cannot hold a stop back, while
  workers that answer (dozens starting up, a long evaluation's steps) let the iteration
  finish as on the in-process backends;
* after any failure or interruption every worker is killed and ``failure`` says why;
  ``close()`` waits at most a second for workers to exit before killing them.

Workers run :func:`rlloop.envs.gym_worker.gym_worker` (forkserver start: no inherited signal
handlers or locks of the trainer; they die with their parent).
"""

from __future__ import annotations

import contextlib
import logging
import math
import selectors
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from copy import deepcopy
from typing import Any, NoReturn

import numpy as np
from gymnasium.error import AlreadyPendingCallError, ClosedEnvironmentError
from gymnasium.vector import AsyncVectorEnv, AutoresetMode
from gymnasium.vector.async_vector_env import AsyncState
from gymnasium.vector.utils import concatenate

from rlloop.envs.gym_worker import gym_worker
from rlloop.errors import RlloopError
from rlloop.system.signals import StopInterrupted, stop_requested_since

START_TIMEOUT_S = 120.0
"""Extra seconds for the first answer: a worker process starts and makes its env."""
STOP_GRACE_S = 3.0
"""Seconds without an answer a wait goes on after a stop signal before it gives up."""
START_STOP_GRACE_S = 15.0
"""The same for the workers' start-up (a process start and its imports, one after another
on a loaded machine: the first answer can take seconds)."""
_POLL_S = 0.25  # how often a wait looks at the stop request
_log = logging.getLogger(__name__)


class EnvWorkerError(RlloopError, RuntimeError):
    """A gymnasium-async env worker raised, died or hung; the vector env is closed."""


def _mask_infos(masks: Sequence[Any]) -> dict[str, Any]:
    """Vector infos (Gymnasium's layout) of the envs' ``info["action_mask"]``s: stacked,
    with ``_action_mask`` saying which envs gave one; empty when none did."""
    present = np.array([m is not None for m in masks], dtype=bool)
    if not present.any():
        return {}
    blank = np.zeros_like(np.asarray(next(m for m in masks if m is not None)))
    stacked = np.stack([blank if m is None else np.asarray(m) for m in masks])
    return {"action_mask": stacked, "_action_mask": present}


class GuardedAsyncVectorEnv(AsyncVectorEnv):
    """``AsyncVectorEnv`` in same-step autoreset mode with bounded waits (module doc).

    Resets and steps return Gymnasium's tuples with only ``action_mask`` (where the env
    gives one), ``final_obs`` and ``final_info["action_mask"]`` in the infos.
    """

    def __init__(self, env_fns: Sequence[Callable[[], Any]], *, env_id: str,
                 step_timeout: float | None = 60.0) -> None:
        if step_timeout is not None and step_timeout <= 0:
            raise ValueError(f"step_timeout must be > 0 or None, got {step_timeout}")
        self.env_id, self.step_timeout = env_id, step_timeout
        self.failure: str | None = None
        """Why the workers are gone (None while they serve)."""
        self._selector: selectors.BaseSelector | None = None
        super().__init__(env_fns, shared_memory=False, context="forkserver", worker=gym_worker,
                         autoreset_mode=AutoresetMode.SAME_STEP)

    # ---- senders: a worker that is gone fails like one that died mid-command ------------
    def reset_async(self, *args: Any, **kwargs: Any) -> None:
        with self._sending():
            super().reset_async(*args, **kwargs)

    def step_async(self, actions: Any) -> None:
        with self._sending():
            super().step_async(actions)

    def call_async(self, name: str, /, *args: object, **kwargs: object) -> None:
        with self._sending():
            super().call_async(name, *args, **kwargs)

    def set_attr(self, name: str, values: Any) -> None:
        self._assert_is_running()
        if not isinstance(values, list | tuple):
            values = [values] * self.num_envs
        if len(values) != self.num_envs:
            raise ValueError(f"set_attr needs {self.num_envs} values, got {len(values)}")
        with self._sending():
            for pipe, value in zip(self.parent_pipes, values, strict=True):
                pipe.send(("_setattr", (name, value)))
        self._receive("set_attr()", self.step_timeout)

    def _check_spaces(self) -> None:
        with self._sending():
            for pipe in self.parent_pipes:
                pipe.send(("_check_spaces", (self.observation_mode, self.single_observation_space,
                                             self.single_action_space)))
        allowed = START_TIMEOUT_S + (self.step_timeout or math.inf)
        same_obs, same_action = zip(*self._receive("start-up", allowed), strict=True)
        if not (all(same_obs) and all(same_action)):
            self.close(terminate=True)
            raise RuntimeError(f"{self.env_id}: the sub-envs' spaces differ; every copy of "
                               "an env must have the same observation and action space")

    @contextlib.contextmanager
    def _sending(self) -> Iterator[None]:
        try:
            yield
        except (BrokenPipeError, ConnectionResetError) as e:
            dead = [i for i, p in enumerate(self.processes) if not p.is_alive()]
            if not dead:
                self._abandon(f"lost a pipe to a worker ({e})")
                raise
            try:
                self._died(dead[0], "a command")
            except (EnvWorkerError, StopInterrupted) as error:
                self._abandon(str(error))
                raise error from e
        except (EnvWorkerError, AlreadyPendingCallError, ClosedEnvironmentError):
            raise  # raised before anything was sent
        except BaseException as e:  # some workers may have the command, others not
            self._abandon(str(e) or type(e).__name__)
            raise

    # ---- receivers ----------------------------------------------------------------------
    def reset_wait(self, timeout: float | None = None, **_: Any) -> tuple[Any, dict[str, Any]]:
        self._expect(AsyncState.WAITING_RESET)
        obs, masks = zip(*self._receive("reset()", self.step_timeout), strict=True)
        return self._batch(obs), _mask_infos(masks)

    def step_wait(self, timeout: float | None = None) -> tuple[Any, ...]:
        self._expect(AsyncState.WAITING_STEP)
        obs, reward, terminated, truncated, final, masks, final_masks = zip(
            *self._receive("step()", self.step_timeout), strict=True)
        ended = np.array([f is not None for f in final], dtype=bool)
        infos = _mask_infos(masks)
        if ended.any():
            final_obs = np.empty(self.num_envs, dtype=object)
            for i in np.flatnonzero(ended):
                final_obs[i] = final[i]
            infos.update(final_obs=final_obs, _final_obs=ended,
                         final_info=_mask_infos(final_masks))
        return (self._batch(obs), np.array(reward, dtype=np.float64),
                np.array(terminated, dtype=bool), np.array(truncated, dtype=bool), infos)

    def call_wait(self, timeout: float | None = None) -> tuple[Any, ...]:
        self._expect(AsyncState.WAITING_CALL)
        return tuple(self._receive("call()", self.step_timeout))

    def _expect(self, state: AsyncState) -> None:
        self._assert_is_running()
        if self._state != state:
            raise RuntimeError(f"no {state.value} call is in flight")

    def _batch(self, observations: Sequence[Any]) -> Any:
        self.observations = concatenate(self.single_observation_space, observations,
                                        self.observations)
        return deepcopy(self.observations) if self.copy else self.observations

    def _receive(self, command: str, timeout: float | None) -> list[Any]:
        """Every worker's answer to the command in flight, in env order."""
        started = time.monotonic()
        deadline = started + (math.inf if timeout is None else timeout)
        answers: dict[int, Any] = {}
        try:
            if self._selector is None:  # one selector for all waits: a wait costs one syscall
                self._selector = selectors.DefaultSelector()
                for i, pipe in enumerate(self.parent_pipes):
                    self._selector.register(pipe, selectors.EVENT_READ, i)
            answered = started  # when a worker last answered this command
            while len(answers) < self.num_envs:
                self._check_stop(command, answered)
                ready = self._selector.select(max(0.0, min(deadline - time.monotonic(),
                                                           _POLL_S)))
                for key, _ in ready:  # a dead worker's pipe reads EOF: _answer names it
                    answers[key.data] = self._answer(key.data, command)
                    answered = time.monotonic()
                if not ready:  # someone is slow: has it died, or missed its deadline?
                    slow = [i for i in range(self.num_envs) if i not in answers]
                    for i in slow:
                        if not self.processes[i].is_alive():
                            self._died(i, command)
                    if time.monotonic() >= deadline:
                        self._fail(slow[0], f"did not answer {command} within step_timeout="
                                   f"{self.step_timeout} s", "raise step_timeout if the env "
                                   "is only slow, else fix it")
        except BaseException as e:
            self._abandon(str(e) or type(e).__name__)
            raise
        self._state = AsyncState.DEFAULT
        return [answers[i] for i in range(self.num_envs)]

    @staticmethod
    def _fix(command: str) -> str:
        if command == "start-up":  # e.g. a script without the main guard, run again there
            return ("fix what the worker printed above (a script that starts workers needs "
                    "`if __name__ == \"__main__\":`)")
        return "fix the env"

    def _died(self, i: int, command: str) -> NoReturn:
        """Worker ``i`` is gone. After a stop signal that signal is why (a scheduler's
        SIGTERM to the whole process group reaches the workers too): the run stops as at
        an iteration boundary, its final checkpoint without the envs' state; otherwise
        the env is blamed."""
        if stop_requested_since() is not None:
            raise StopInterrupted(f"{self.env_id}: worker {i} {self._death(i, command)} "
                                  "after a stop signal")
        self._fail(i, self._death(i, command), self._fix(command))

    def _answer(self, i: int, command: str) -> Any:
        try:
            payload, ok = self.parent_pipes[i].recv()
        except (EOFError, OSError):
            self._died(i, command)
        if not ok:
            name, message, trace = payload
            _log.error("%s: env worker %d raised in %s:\n%s", self.env_id, i, command,
                       trace.rstrip())
            self._fail(i, f"raised in {command}: {name}: {message} (traceback above)",
                       "fix the env")
        return payload

    def _death(self, i: int, command: str) -> str:
        process = self.processes[i]
        process.join(0.5)
        code = process.exitcode
        how = (f"was killed by {signal.Signals(-code).name}" if code is not None and code < 0
               else f"exited with code {code}")
        return f"{how} in {command}"

    def _fail(self, i: int, what: str, fix: str) -> NoReturn:
        raise self._error(i, what, fix)

    def _error(self, i: int, what: str, fix: str) -> EnvWorkerError:
        return EnvWorkerError(f"gymnasium-async env {self.env_id!r}: worker {i} (pid "
                              f"{self.processes[i].pid}) {what}; {fix}, then resume from "
                              "the last checkpoint")

    def _check_stop(self, command: str, answered: float) -> None:
        """Give up a wait whose last answer came at ``answered`` once no answer has come
        for ``STOP_GRACE_S`` past a stop signal (a long evaluation's short waits, or
        workers starting one after another, never do)."""
        since = stop_requested_since()
        grace = START_STOP_GRACE_S if command == "start-up" else STOP_GRACE_S
        if since is not None and time.monotonic() >= max(since, answered) + grace:
            raise StopInterrupted(f"{self.env_id}: gave up waiting for {command} "
                                  f"{grace} s after a stop signal")

    # ---- teardown -----------------------------------------------------------------------
    def _assert_is_running(self) -> None:
        if self.failure is not None:
            raise EnvWorkerError(f"{self.env_id}: the env's workers are gone ({self.failure})")
        super()._assert_is_running()

    def _abandon(self, why: str) -> None:
        if self.failure is None:
            self.failure = why
        self._stop_workers(grace=0.0)
        self.closed = True

    def close_extras(self, timeout: float | None = None, terminate: bool = False) -> None:
        polite = not terminate and self.failure is None and self._state == AsyncState.DEFAULT
        if polite:
            for pipe in self.parent_pipes:
                with contextlib.suppress(OSError):
                    pipe.send(("close", None))  # the env gets to close itself
        self._stop_workers(grace=1.0 if polite else 0.0)

    def _stop_workers(self, grace: float) -> None:
        """Join for up to ``grace`` seconds, then SIGTERM, then SIGKILL; close the pipes."""
        deadline = time.monotonic() + grace
        for process in self.processes:
            process.join(max(0.0, deadline - time.monotonic()))
        for process in self.processes:
            if process.is_alive():
                process.terminate()
                process.join(0.5)
            if process.is_alive():
                process.kill()
                process.join(5.0)
        if self._selector is not None:
            self._selector.close()
        for pipe in self.parent_pipes:
            if pipe is not None:
                pipe.close()
