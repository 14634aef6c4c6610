"""Run-control signals shared by every training loop: stop cleanly, or save without stopping.

``SIGTERM``/``SIGINT`` set ``target.stop_requested`` (the signal's name) so the loop stops
at its next boundary and saves a final checkpoint. A second ``SIGTERM`` or ``SIGINT``
raises ``KeyboardInterrupt`` at once (an env that hangs in-process never lets the loop
reach a boundary), or where an :func:`atomic` block (an update) ends, and a third one
gets the default action: the process dies even if
the main thread is stuck in C code. ``SIGUSR1`` sets ``target.save_requested`` so the
loop saves a checkpoint and goes on.

Waits that block outside the loop (the gymnasium-async backend waiting on its worker
processes) poll :func:`stop_requested_since` and give up with :class:`StopInterrupted`
a few seconds after a stop request, so a hung worker cannot hold a stop back; an
evaluation gives up :data:`EVAL_STOP_GRACE_S` after one (:func:`check_eval_stop`).
"""

from __future__ import annotations

import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from types import FrameType
from typing import Any, Protocol

#: What ``signal.signal`` takes: a function of (signum, frame), SIG_DFL or SIG_IGN.
Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_stop_since: float | None = None
_interrupted = False  # the second stop signal raised KeyboardInterrupt
_atomic_depth = 0  # inside `atomic` blocks: the second stop signal waits for their end


class SignalTarget(Protocol):
    stop_requested: str | None
    save_requested: bool


class StopInterrupted(Exception):
    """A blocking wait gave up because a stop signal arrived; the run stops as if at a
    boundary (final checkpoint of the last completed iteration)."""


def signal_in_words(name: str) -> str:
    """A stop signal as a user knows it: ``SIGINT`` is the Ctrl-C they pressed."""
    return "Ctrl-C (SIGINT)" if name == "SIGINT" else name


def stop_requested_since() -> float | None:
    """``time.monotonic()`` of the first stop signal inside :func:`handle_signals`, or None."""
    return _stop_since


#: Seconds an evaluation may go on after a stop signal before it is left (for the resume).
EVAL_STOP_GRACE_S = 10.0


def check_eval_stop(done: int, episodes: int) -> None:
    """Raise :class:`StopInterrupted` in an evaluation (``done`` of ``episodes`` episodes
    played) once a stop signal has waited :data:`EVAL_STOP_GRACE_S`: a long evaluation
    (Atari's whole games, a 100-episode solve confirmation) must not outlast a
    scheduler's grace period. The run stops as at a boundary; its checkpoint holds the
    update without the evaluation, which the resumed run makes first, on the same
    episodes."""
    if _stop_since is not None and time.monotonic() >= _stop_since + EVAL_STOP_GRACE_S:
        raise StopInterrupted(f"evaluation left after {done} of {episodes} episodes, "
                              f"{EVAL_STOP_GRACE_S:g} s after a stop signal; the resumed run "
                              "makes it")


def interrupted() -> bool:
    """Whether a second stop signal raised ``KeyboardInterrupt`` inside
    :func:`handle_signals`. Code that wraps an env's errors asks this first: C extensions
    that run Python callbacks (Box2D's contact listener) can turn that interrupt into an
    error of their own, which would otherwise be blamed on the env."""
    return _interrupted


@contextmanager
def installed(handlers: Mapping[int, Handler]) -> Iterator[bool]:
    """``handlers`` (signal -> handler) for the duration of the block, the previous ones
    restored after it; in the main thread only (no import-time side effects; other threads
    cannot install handlers, and their block runs without). Yields whether they were."""
    if threading.current_thread() is not threading.main_thread():
        yield False
        return
    previous = {sig: signal.signal(sig, handler) for sig, handler in handlers.items()}
    try:
        yield True
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextmanager
def handle_signals(target: SignalTarget) -> Iterator[None]:
    """Install the stop and save handlers for the duration of the block (see
    :func:`installed`)."""
    global _stop_since, _interrupted

    def stop(signum: int, _: FrameType | None) -> None:
        global _stop_since, _interrupted
        if target.stop_requested:
            for sig in _STOP_SIGNALS:
                signal.signal(sig, signal.SIG_DFL)
            _interrupted = True
            if _atomic_depth:  # raised where the iteration's update is whole (`atomic`)
                return
            raise KeyboardInterrupt
        target.stop_requested = signal.Signals(signum).name
        _stop_since = time.monotonic()

    def save(signum: int, _: FrameType | None) -> None:
        target.save_requested = True

    with installed({signal.SIGTERM: stop, signal.SIGINT: stop,
                     signal.SIGUSR1: save}) as active:
        if not active:
            yield
            return
        _stop_since, _interrupted = None, False
        try:
            with _stop_signals_wake_the_main_thread():
                yield
        finally:
            _stop_since, _interrupted = None, False


#: What wakes the main thread for its handlers (:func:`_stop_signals_wake_the_main_thread`):
#: a signal whose default action is to do nothing, which a training process never uses.
_WAKE_SIGNAL = getattr(signal, "SIGURG", None)


@contextmanager
def _stop_signals_wake_the_main_thread() -> Iterator[None]:
    """Have a stop signal interrupt the main thread, whichever thread the kernel gave it to.

    Python runs handlers in the main thread only, and a call blocking there (an env's
    ``time.sleep`` in ``step()``) returns to run them only when the signal interrupts
    that thread. Linux hands a process's signal to any thread that does not block it: to
    another one when the main thread already has one pending (SIGINT and SIGTERM sent
    together), and the second signal's handler then waited until the sleep ended, maybe
    forever. Python's C handler writes each signal's number to the wakeup fd, in whatever
    thread it runs; a thread reading it sends the main thread :data:`_WAKE_SIGNAL`, whose
    interruption makes it run the pending handlers. A wakeup fd set by someone else (an
    asyncio loop) is left alone, and then this does nothing."""
    wake = _WAKE_SIGNAL
    if wake is None or not hasattr(signal, "pthread_kill"):  # not POSIX
        yield
        return
    reader, writer = socket.socketpair()
    writer.setblocking(False)  # the C handler must never block on a full buffer
    previous = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    if previous != -1:
        signal.set_wakeup_fd(previous)
        reader.close()
        writer.close()
        yield
        return
    main = threading.get_ident()  # handle_signals runs in the main thread
    stops = {int(sig) for sig in _STOP_SIGNALS}

    def wake_main() -> None:
        while received := reader.recv(64):  # b"": the block has ended
            if stops.intersection(received):
                signal.pthread_kill(main, wake)

    watcher = threading.Thread(target=wake_main, name="rlloop-signal-wake", daemon=True)
    watcher.start()
    try:
        with installed({wake: lambda signum, frame: None}):
            yield
    finally:
        signal.set_wakeup_fd(-1)
        writer.close()
        watcher.join(5)
        reader.close()


@contextmanager
def atomic() -> Iterator[None]:
    """A part of an iteration that a second stop signal does not cut: the update and the
    counters that count it. The interrupt waits for the block's end, so the final
    checkpoint never holds a half-applied update or counters that disagree with the
    weights (a third signal still kills at once)."""
    global _atomic_depth
    _atomic_depth += 1
    try:
        yield
    finally:
        _atomic_depth -= 1
    if not _atomic_depth and _interrupted and sys.exception() is None:
        raise KeyboardInterrupt


@contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """In the block, ``SIGTERM`` raises ``KeyboardInterrupt`` as Ctrl-C does (main thread
    only), so a run stopped after training (its video, report, MLflow artifacts) still
    closes its sinks and its MLflow run; :func:`handle_signals` takes over inside it."""
    def interrupt(signum: int, _: FrameType | None) -> None:
        raise KeyboardInterrupt

    with installed({signal.SIGTERM: interrupt}):
        yield


@contextmanager
def supervised(target: SignalTarget, finish: Callable[[str], None]) -> Iterator[None]:
    """Run the block with the signal handlers installed, then always ``finish(status)``.

    ``status`` is MLflow's: ``"FINISHED"``, ``"KILLED"`` (stopped by a signal) or
    ``"FAILED"`` (the block raised). ``finish`` writes the final checkpoint and closes the
    sinks, so what was learned is kept whatever ended the run.
    """
    status = "FAILED"
    try:
        with handle_signals(target):
            yield
        status = "KILLED" if target.stop_requested else "FINISHED"
    finally:
        with _held(interrupted_already=isinstance(sys.exception(), KeyboardInterrupt)):
            finish(status)


@contextmanager
def _held(*, interrupted_already: bool) -> Iterator[None]:
    """Run ``finish`` (the final checkpoint) to its end through a stop signal.

    A ``SIGTERM``/``SIGINT`` that arrives meanwhile waits until the block is done, then
    ends the run as interrupted (``KeyboardInterrupt``: exit code 130); one more kills at
    once. Where a second stop signal has interrupted the run already, the next one kills
    (the default action), as :func:`handle_signals` promises.
    """
    held: list[int] = []

    def hold(signum: int, _: FrameType | None) -> None:
        held.append(signum)
        for sig in _STOP_SIGNALS:
            signal.signal(sig, signal.SIG_DFL)

    handler: Handler = signal.SIG_DFL if interrupted_already else hold
    with installed(dict.fromkeys(_STOP_SIGNALS, handler)):
        yield
    if held and sys.exception() is None:
        raise KeyboardInterrupt


def save_due(target: SignalTarget, every: int, count: int, since: int | None = None) -> bool:
    """Whether a checkpoint is due at ``count``: every ``every`` (0: never), or because
    ``SIGUSR1`` asked for one (the request is then taken). ``since``, the count at the
    previous boundary, makes a multiple of ``every`` passed since then due too (a
    boundary that spans several counts, such as a task's epoch)."""
    if since is None:
        passed = bool(every) and count % every == 0
    else:
        passed = bool(every) and count // every > since // every
    if target.save_requested or passed:
        target.save_requested = False
        return True
    return False
