"""How a worker pool runs its workers: on the caller's thread, in threads, or in processes.

A backend starts worker ``rank`` (an :class:`~rlloop.system.worker_loop.EnvGroup` made from the
env factory), carries ``(seq, ops)`` messages to it and brings ``(rank, (seq, reply))``
back, and stops it. Everything above that (sequence numbers, deadlines, restarts,
batching) is the pool's job, in :mod:`rlloop.envs.pool`, and is the same for all three.

A worker that dies is reported as ``(rank, (None, Crash("died", ...)))``: ``None``
because its death answers whatever was in flight.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import queue
import signal
import threading
import time
import traceback
import weakref
from collections import deque
from collections.abc import Sequence
from multiprocessing.process import BaseProcess
from typing import Any, Protocol

from rlloop.system.worker_loop import Crash, EnvFactory, EnvGroup, process_main, serve

Reply = tuple[int, Any]
"""``(rank, message)`` where message is ``(seq, list[EnvOutcome] | Crash)``."""

START_METHODS = ("forkserver", "spawn")


class Backend(Protocol):
    def start(self, rank: int, seeds: Sequence[int]) -> None:
        """(Re)start worker ``rank``; an old incarnation is stopped and its replies dropped."""
        ...

    def send(self, rank: int, message: Any) -> None: ...

    def receive(self, timeout: float | None) -> list[Reply]:
        """Replies that arrive within ``timeout`` seconds (``None``: wait for one)."""
        ...

    def close(self) -> None: ...


class SyncBackend:
    """Runs the env on the caller's thread as soon as a message is sent.

    No parallelism and no overhead; the only mode where a hanging env cannot be
    detected (nothing else runs while it hangs).
    """

    def __init__(self, env_fn: EnvFactory) -> None:
        self._env_fn = env_fn
        self._seeds: dict[int, Sequence[int]] = {}
        self._groups: dict[int, EnvGroup] = {}
        self._replies: deque[Reply] = deque()

    def start(self, rank: int, seeds: Sequence[int]) -> None:
        self._drop(rank)
        self._seeds[rank] = seeds

    def send(self, rank: int, message: Any) -> None:
        seq, ops = message
        try:
            if rank not in self._groups:
                self._groups[rank] = EnvGroup(self._env_fn, self._seeds[rank])
            reply: Any = self._groups[rank].run(ops)
        except Exception:
            reply = Crash("raised", traceback.format_exc())
            self._drop(rank)
        self._replies.append((rank, (seq, reply)))

    def receive(self, timeout: float | None) -> list[Reply]:
        out = list(self._replies)
        self._replies.clear()
        return out

    def _drop(self, rank: int) -> None:
        group = self._groups.pop(rank, None)
        if group is not None:
            group.close()

    def close(self) -> None:
        for rank in list(self._groups):
            self._drop(rank)


class _QueueChannel:
    """A worker thread's end: commands from its own inbox, replies tagged into a shared queue."""

    def __init__(self, inbox: queue.SimpleQueue[Any], outbox: queue.SimpleQueue[Any],
                 key: tuple[int, int]) -> None:
        self.inbox, self.outbox, self.key = inbox, outbox, key

    def send(self, obj: Any) -> None:
        self.outbox.put((self.key, obj))

    def recv(self) -> Any:
        return self.inbox.get()


class ThreadBackend:
    """One daemon thread per worker. Worth it when env steps release the GIL (I/O,
    sleeps, simulators in C). A hung thread cannot be killed: it is abandoned (its
    replies are dropped) and a fresh thread with a fresh env takes its rank."""

    def __init__(self, env_fn: EnvFactory) -> None:
        self._env_fn = env_fn
        self._outbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._inboxes: dict[int, queue.SimpleQueue[Any]] = {}
        self._threads: dict[int, threading.Thread] = {}
        self._incarnation: dict[int, int] = {}

    def start(self, rank: int, seeds: Sequence[int]) -> None:
        self._stop(rank)
        incarnation = self._incarnation[rank] = self._incarnation.get(rank, -1) + 1
        inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        channel = _QueueChannel(inbox, self._outbox, (rank, incarnation))
        thread = threading.Thread(target=serve, args=(channel, self._env_fn, list(seeds)),
                                  name=f"rlloop-env-worker-{rank}", daemon=True)
        self._inboxes[rank], self._threads[rank] = inbox, thread
        thread.start()

    def send(self, rank: int, message: Any) -> None:
        self._inboxes[rank].put(message)

    def receive(self, timeout: float | None) -> list[Reply]:
        try:
            items = [self._outbox.get(timeout=timeout)]
        except queue.Empty:
            return []
        while True:
            try:
                items.append(self._outbox.get_nowait())
            except queue.Empty:
                break
        return [(rank, message) for (rank, incarnation), message in items
                if self._incarnation.get(rank) == incarnation]

    def _stop(self, rank: int) -> threading.Thread | None:
        inbox = self._inboxes.pop(rank, None)
        if inbox is not None:
            inbox.put(None)  # a hung thread exits once its step returns
        return self._threads.pop(rank, None)

    def close(self) -> None:
        threads = [t for t in (self._stop(r) for r in list(self._inboxes)) if t is not None]
        deadline = time.monotonic() + 1.0
        for thread in threads:  # let healthy threads close their envs; never wait on a hung one
            thread.join(max(0.0, deadline - time.monotonic()))


class ProcessBackend:
    """One process per worker, talking over a pipe.

    Started with "forkserver" (default) or "spawn", never plain fork: forking a process
    that has started torch's thread pools is fragile. With forkserver a (re)start forks a
    small server process instead of starting an interpreter. Either way the child imports
    the main script again (multiprocessing's rule, so that objects defined there unpickle;
    Python 3.11's forkserver does not preload it), so a script that imports torch at the
    top costs seconds per worker start. Starts run in the background: the pool does not
    wait for a restarting worker, the others keep stepping. Workers ignore SIGINT (the
    parent decides when they stop) and exit on their own if the parent dies. ``close()``,
    garbage collection and interpreter exit all terminate and reap them.
    """

    def __init__(self, env_fn: EnvFactory, start_method: str = "forkserver") -> None:
        if start_method not in START_METHODS:
            raise ValueError(f"start_method must be one of {START_METHODS}, got {start_method!r}")
        self._ctx: Any = multiprocessing.get_context(start_method)
        self._env_fn = env_fn
        self._procs: dict[int, BaseProcess] = {}
        self._conns: dict[int, multiprocessing.connection.Connection] = {}
        self._dead: set[int] = set()
        self._pending: deque[Reply] = deque()
        self.pids: list[int] = []
        """Every worker process ever started (restarts included), for tests and tools."""
        self._finalizer = weakref.finalize(self, _kill_all, self._procs)

    def start(self, rank: int, seeds: Sequence[int]) -> None:
        self._stop(rank, grace=0.0)
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(target=process_main, args=(child, self._env_fn, list(seeds)),
                                 name=f"rlloop-env-worker-{rank}", daemon=True)
        try:
            proc.start()
        finally:
            child.close()
        assert proc.pid is not None
        self.pids.append(proc.pid)
        self._procs[rank], self._conns[rank] = proc, parent
        self._dead.discard(rank)

    def send(self, rank: int, message: Any) -> None:
        if rank in self._dead:
            return
        try:
            self._conns[rank].send(message)
        except (BrokenPipeError, ConnectionResetError, EOFError):
            self._pending.append((rank, (None, self._death(rank))))

    def receive(self, timeout: float | None) -> list[Reply]:
        if self._pending:
            out = list(self._pending)
            self._pending.clear()
            return out
        ranks = {conn: rank for rank, conn in self._conns.items() if rank not in self._dead}
        if not ranks:
            return []
        replies: list[Reply] = []
        for ready in multiprocessing.connection.wait(list(ranks), timeout):
            rank = ranks[ready]  # type: ignore[index]
            try:
                replies.append((rank, self._conns[rank].recv()))
            except (EOFError, OSError):
                replies.append((rank, (None, self._death(rank))))
        return replies

    def _death(self, rank: int) -> Crash:
        self._dead.add(rank)
        proc = self._procs[rank]
        proc.join(0.5)
        code = proc.exitcode
        how = f"was killed by {signal.Signals(-code).name}" if code is not None and code < 0 \
            else f"exited with code {code}"
        return Crash("died", f"env worker process {proc.pid} {how}")

    def _stop(self, rank: int, grace: float) -> None:
        conn, proc = self._conns.pop(rank, None), self._procs.pop(rank, None)
        if conn is not None:
            conn.close()
        if proc is not None:
            _reap(proc, grace)

    def close(self) -> None:
        for rank, conn in self._conns.items():
            if rank not in self._dead:
                with contextlib.suppress(OSError):
                    conn.send(None)  # ask politely: the env gets to close itself
        deadline = time.monotonic() + 1.0
        for rank in list(self._procs):
            self._stop(rank, grace=max(0.0, deadline - time.monotonic()))
        self._finalizer()


def _reap(proc: BaseProcess, grace: float) -> None:
    """Wait ``grace`` seconds, then SIGTERM, then SIGKILL; always join and free the handle."""
    if grace > 0:
        proc.join(grace)
    if proc.is_alive():
        proc.terminate()
        proc.join(0.5)
    if proc.is_alive():
        proc.kill()
        proc.join()
    proc.close()


def _kill_all(procs: dict[int, BaseProcess]) -> None:
    """Finalizer (GC or interpreter exit): no worker outlives its pool."""
    for proc in procs.values():
        try:
            if proc.is_alive():
                proc.kill()
                proc.join(1.0)
        except ValueError:
            pass  # already closed
    procs.clear()


def make_backend(mode: str, env_fn: EnvFactory, start_method: str = "forkserver") -> Backend:
    if mode == "sync":
        return SyncBackend(env_fn)
    if mode == "thread":
        return ThreadBackend(env_fn)
    if mode == "process":
        return ProcessBackend(env_fn, start_method)
    raise ValueError(f"env worker mode must be sync, thread or process, got {mode!r}")
