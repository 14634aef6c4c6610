"""Env workers for slow, single-instance or flaky envs: a pool with batched inference.

This is the K-Scale ``ml`` trainer's sampling model. Each of ``num_workers`` workers owns
``envs_per_worker`` Gymnasium-style envs and runs them on the caller's thread
(``"sync"``), in a thread (``"thread"``) or in a process (``"process"``). The caller asks
for a batch of ready observations with :meth:`WorkerPool.next_batch`, runs one forward
pass over it, and hands the actions back with :meth:`WorkerPool.send`; meanwhile the
other workers keep stepping. Env ``j`` of worker ``rank`` is seeded with
``env_seed + rank * envs_per_worker + j`` (``env_seed + rank`` with one env per worker).

Fault tolerance: a worker whose env raises, whose process dies, or which does not
answer within ``step_timeout`` seconds is restarted with a fresh env (reseeded so that
a deterministic crash is not replayed), its slots come back with ``Ready.restarted``
set so the caller can drop their partial trajectories, and ``WorkerPool.restarts``
counts it. With ``restart_failed_workers=False`` the pool closes itself and raises
:class:`WorkerError` carrying the worker's traceback instead.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from rlloop.envs.worker import ProcessBackend, make_backend
from rlloop.errors import RlloopError
from rlloop.system.worker_loop import Crash, EnvFactory, EnvOutcome, Reseed

__all__ = ["EnvFactory", "EnvOutcome", "Ready", "WorkerError", "WorkerMode", "WorkerPool"]

WorkerMode = Literal["sync", "thread", "process"]
_log = logging.getLogger(__name__)
#: Seconds between two looks at ``next_batch``'s ``should_stop`` while it waits.
STOP_POLL_S = 0.1
_MISSING = object()
_WHAT = {"raised": "raised an exception", "died": "died", "hung": "hung"}


class WorkerError(RlloopError, RuntimeError):
    """An env worker failed and was not restarted. ``detail`` holds the worker's traceback
    (or how it died / how long it was silent)."""

    def __init__(self, rank: int, kind: str, detail: str, fix: str) -> None:
        self.rank, self.kind, self.detail = rank, kind, detail
        super().__init__(f"env worker {rank} {_WHAT.get(kind, kind)}; {fix}\n"
                         f"--- worker {rank} ---\n{detail.rstrip()}")


class Ready(NamedTuple):
    """One env that waits for an action.

    Attributes:
        slot: Index of the env in the pool, ``rank * envs_per_worker + j``.
        outcome: What the env reported (see :class:`~rlloop.system.worker_loop.EnvOutcome`).
        restarted: The worker was restarted since this slot last reported: ``outcome``
            starts a new episode and whatever the caller held for the slot is void.
        generation: Which start of the worker produced this (actions for a stale one
            are ignored by :meth:`WorkerPool.send`).
    """

    slot: int
    outcome: EnvOutcome
    restarted: bool
    generation: int


@dataclass
class _Worker:
    generation: int = -1
    seq: int = 0
    in_flight: bool = False
    deadline: float = math.inf
    answered_since_start: bool = False
    stepped: bool = False  # the command in flight holds at least one action
    results: list[Ready] | None = None  # answered, not yet handed out
    handed_out: bool = False
    restarted: bool = False
    failures_in_row: int = 0


class WorkerPool:
    """``num_workers`` env workers (0 means one worker in sync mode). See the module doc.

    Args:
        env_fn: Makes one env; picklable for process workers.
        num_workers: Workers; ``0`` runs one env group in-process (``mode`` is ignored).
        mode: ``"sync"``, ``"thread"`` or ``"process"``.
        envs_per_worker: Envs each worker owns and steps per command.
        env_seed: Seed of env 0; the others get consecutive seeds.
        step_timeout: Seconds a worker may take to answer before it counts as hung
            (``None``: wait forever). Not enforceable in sync mode.
        start_timeout: Extra seconds allowed for the first answer after a (re)start,
            which includes starting the process and making the env.
        restart_failed_workers: Restart failed workers (else raise :class:`WorkerError`).
        max_consecutive_failures: A worker that fails this many times in a row without
            completing a step is broken, not flaky: raise instead of restarting forever.
        start_method: ``"forkserver"`` or ``"spawn"`` for process workers.
    """

    def __init__(
        self,
        env_fn: EnvFactory,
        num_workers: int = 1,
        mode: WorkerMode = "process",
        *,
        envs_per_worker: int = 1,
        env_seed: int = 1337,
        step_timeout: float | None = 60.0,
        start_timeout: float = 120.0,
        restart_failed_workers: bool = True,
        max_consecutive_failures: int = 3,
        start_method: str = "forkserver",
    ) -> None:
        if num_workers < 0 or envs_per_worker < 1 or max_consecutive_failures < 1:
            raise ValueError("num_workers must be >= 0, envs_per_worker and "
                             "max_consecutive_failures >= 1")
        if step_timeout is not None and step_timeout <= 0:
            raise ValueError(f"step_timeout must be > 0 or None, got {step_timeout}")
        self.mode: WorkerMode = "sync" if num_workers == 0 else mode
        self.envs_per_worker = envs_per_worker
        self.env_seed = env_seed
        self.step_timeout, self.start_timeout = step_timeout, start_timeout
        self.restart_failed_workers = restart_failed_workers
        self.max_consecutive_failures = max_consecutive_failures
        self.restarts = 0
        """Workers restarted after a failure (logged as ``workers/restarts``)."""
        self._backend = make_backend(self.mode, env_fn, start_method)
        self._workers = [_Worker() for _ in range(max(num_workers, 1))]
        self._ready: deque[int] = deque()
        self._needs_reset = True
        self._closed = False
        try:
            for rank in range(len(self._workers)):
                self._start(rank)
        except BaseException:
            self.close()
            raise

    @property
    def num_workers(self) -> int:
        return len(self._workers)

    @property
    def num_slots(self) -> int:
        """Envs in the pool: the most observations one batch can hold."""
        return len(self._workers) * self.envs_per_worker

    @property
    def pids(self) -> list[int]:
        """Every worker process started so far (process mode; restarts included)."""
        return list(self._backend.pids) if isinstance(self._backend, ProcessBackend) else []

    # ---- the caller's side ---------------------------------------------------------------
    def reset(self, seeds: Sequence[int] | None = None) -> None:
        """Start new episodes in every env; answers to earlier commands are dropped.
        ``seeds`` (one per slot) reseeds the envs; without it each env's RNG continues."""
        if seeds is not None and len(seeds) != self.num_slots:
            raise ValueError(f"reset() needs one seed per env ({self.num_slots}), got "
                             f"{len(seeds)}")
        self._ready.clear()
        k = self.envs_per_worker
        for rank, w in enumerate(self._workers):
            w.results, w.handed_out = None, False
            self._send(rank, [None] * k if seeds is None
                       else [Reseed(int(seed)) for seed in seeds[rank * k:(rank + 1) * k]])
        self._needs_reset = False

    def next_batch(self, min_size: int = 1, max_size: int | None = None,
                   max_wait: float | None = None,
                   should_stop: Callable[[], bool] | None = None) -> list[Ready]:
        """Ready envs for one forward pass (``ml``'s rule).

        Waits until at least ``min_size`` envs are ready; returns at most ``max_size``
        (default: all envs); once ``min_size`` is met, waits for more only until
        ``max_wait`` seconds have passed since the call (``None``: until ``max_size``
        are ready, so the slowest worker sets the pace). A worker's envs always come
        together. Envs ready beyond ``max_size`` wait for the next call. While it waits,
        ``should_stop`` is asked every ``STOP_POLL_S``; once it says yes the call returns
        at once, with an empty batch if too few envs are ready (a stop does not wait for
        a slow or hung worker's ``step_timeout``).
        """
        k = self.envs_per_worker
        max_size = self.num_slots if max_size is None else min(max_size, self.num_slots)
        if min_size > max_size:
            raise ValueError(f"min_batch_size={min_size} > max_batch_size={max_size}")
        if max_size < k:
            raise ValueError(f"max_batch_size={max_size} < envs_per_worker={k}: a worker's "
                             "envs always come in one batch")
        most, least = max_size // k, -(-min_size // k)
        if least > most:
            raise ValueError(f"no multiple of envs_per_worker={k} lies in [min_batch_size="
                             f"{min_size}, max_batch_size={max_size}]")
        if self._needs_reset:
            self.reset()
        start = time.monotonic()
        while len(self._ready) < most:
            in_flight = any(w.in_flight for w in self._workers)
            if should_stop is not None and should_stop():
                if len(self._ready) < least:
                    return []
                break
            if len(self._ready) < least:
                if not in_flight:
                    raise RuntimeError("no env worker is stepping: send() actions for the "
                                       "previous batch before asking for the next one")
                self._poll(None if should_stop is None else STOP_POLL_S)
                continue
            left = math.inf if max_wait is None else start + max_wait - time.monotonic()
            if left <= 0 or not in_flight:
                break
            if should_stop is not None:
                left = min(left, STOP_POLL_S)
            self._poll(None if left == math.inf else left)
        batch: list[Ready] = []
        for _ in range(min(most, len(self._ready))):
            w = self._workers[self._ready.popleft()]
            assert w.results is not None
            batch.extend(w.results)
            w.results, w.handed_out = None, True
        return batch

    def send(self, batch: Sequence[Ready], actions: Sequence[Any]) -> None:
        """Step the envs of ``batch`` with ``actions`` (``None`` resets that env instead).

        Every env of a worker in ``batch`` needs an entry; entries for workers that were
        restarted since the batch was handed out are ignored (they were reset already).
        """
        if len(batch) != len(actions):
            raise ValueError(f"{len(batch)} ready envs but {len(actions)} actions")
        k = self.envs_per_worker
        ops: dict[int, list[Any]] = {}
        for ready, action in zip(batch, actions, strict=True):
            rank, j = divmod(ready.slot, k)
            w = self._workers[rank]
            if ready.generation == w.generation and w.handed_out:
                ops.setdefault(rank, [_MISSING] * k)[j] = action
        for rank, worker_ops in ops.items():
            if any(op is _MISSING for op in worker_ops):
                raise ValueError(f"send() needs an action (or None) for each of the {k} envs "
                                 f"of worker {rank}")
            self._workers[rank].handed_out = False
            self._send(rank, worker_ops)

    def close(self) -> None:
        """Stop every worker (processes are joined or killed); safe to call twice."""
        if not self._closed:
            self._closed = True
            self._backend.close()

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- workers -------------------------------------------------------------------------
    def _seeds(self, rank: int, generation: int) -> list[int]:
        # A restart gets seeds no other env used, so a deterministic crash is not replayed.
        first = self.env_seed + (rank + generation * self.num_workers) * self.envs_per_worker
        return list(range(first, first + self.envs_per_worker))

    def _start(self, rank: int) -> None:
        w = self._workers[rank]
        w.generation += 1
        w.answered_since_start = False
        w.in_flight, w.results, w.handed_out = False, None, False
        self._backend.start(rank, self._seeds(rank, w.generation))

    def _send(self, rank: int, ops: list[Any]) -> None:
        w = self._workers[rank]
        w.seq += 1
        timeout = math.inf if self.step_timeout is None else self.step_timeout
        if not w.answered_since_start:
            timeout += self.start_timeout
        deadline = time.monotonic() + timeout
        # A reset sent to a worker that is still busy must not extend its deadline.
        w.deadline = min(w.deadline, deadline) if w.in_flight else deadline
        w.in_flight = True
        w.stepped = any(op is not None and not isinstance(op, Reseed) for op in ops)
        self._backend.send(rank, (w.seq, ops))

    def _poll(self, timeout: float | None) -> None:
        """Take in what arrives within ``timeout`` (bounded by the nearest deadline)."""
        deadline = min((w.deadline for w in self._workers if w.in_flight), default=math.inf)
        wait = deadline - time.monotonic()
        if timeout is not None:
            wait = min(wait, timeout)
        for rank, (seq, payload) in self._backend.receive(
                None if wait == math.inf else max(wait, 0.0)):
            self._on_reply(rank, seq, payload)
        now = time.monotonic()
        for rank, w in enumerate(self._workers):
            if w.in_flight and w.deadline <= now:
                self._fail(rank, Crash("hung", f"no answer within step_timeout="
                                               f"{self.step_timeout} s"))

    def _on_reply(self, rank: int, seq: int | None, payload: Any) -> None:
        w = self._workers[rank]
        if isinstance(payload, Crash):
            if seq is None or (w.in_flight and seq == w.seq):
                self._fail(rank, payload)
            return
        if not w.in_flight or seq != w.seq:
            return  # answers a command that a reset superseded
        w.in_flight, w.deadline, w.answered_since_start = False, math.inf, True
        if w.stepped:
            w.failures_in_row = 0
        k = self.envs_per_worker
        w.results = [Ready(rank * k + j, outcome, w.restarted, w.generation)
                     for j, outcome in enumerate(payload)]
        w.restarted = False
        self._ready.append(rank)

    def _fail(self, rank: int, crash: Crash) -> None:
        w = self._workers[rank]
        w.failures_in_row += 1
        if not self.restart_failed_workers or w.failures_in_row > self.max_consecutive_failures:
            fix = ("restart_failed_workers is off; turn it on to restart failed workers and "
                   "keep training" if not self.restart_failed_workers else
                   f"it failed {w.failures_in_row} times in a row without completing a step, "
                   "so the env is broken rather than flaky; fix the env")
            self.close()
            raise WorkerError(rank, crash.kind, crash.detail, fix)
        self.restarts += 1
        last = crash.detail.strip().splitlines()[-1] if crash.detail.strip() else ""
        _log.warning("env worker %d %s (%s); restarting it (restarts so far: %d)",
                     rank, _WHAT.get(crash.kind, crash.kind), last, self.restarts)
        if w.results is not None:
            self._ready.remove(rank)
        self._start(rank)
        w.restarted = True
        self._send(rank, [None] * self.envs_per_worker)
