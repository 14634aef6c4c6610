"""One training process per run directory: an advisory ``flock`` on ``<run>/.lock``.

Two trainers writing one run directory interleave ``metrics.jsonl``, mix the checkpoints
of two seeds and rewrite each other's ``config.yaml``; the second one is refused instead.
The kernel drops a ``flock`` when its holder exits, however it exits, so a trainer that
was SIGKILLed leaves no stale lock: the next one takes the file over. The file holds the
holder's PID for the error message only; it is never deleted, because unlinking a lock file
lets two processes lock two different files of the same name. Readers (``rlloop eval``)
take no lock: checkpoints are replaced atomically under them.
"""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path
from types import TracebackType

from rlloop.errors import RunDirError

try:
    import fcntl
except ImportError:  # not POSIX: runs are not locked
    fcntl = None  # type: ignore[assignment]

LOCK_FILE = ".lock"


class RunLock:
    """Exclusive lock on a run directory, held from `acquire` to `release` (or exit)."""

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_FILE
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> RunLock:
        """Create the run directory if needed and lock it; `RunDirError` if another holds it."""
        if self._fd is not None:
            return self
        self.run_dir.mkdir(parents=True, exist_ok=True)
        # O_NOFOLLOW: a planted link must not make the PID write truncate its target.
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as e:
            if e.errno != errno.ELOOP:
                raise
            raise RunDirError(f"{self.path} is a symbolic link; rlloop never writes through "
                              "links in a run directory: remove the link") from None
        try:
            if fcntl is not None:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    raise RunDirError(
                        f"{self.run_dir} is in use by another rlloop process "
                        f"(PID {_holder(fd)} holds {self.path}); wait for it to end or stop "
                        "it, or choose another --run-dir") from None
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return self

    def release(self) -> None:
        """Unlock; idempotent. Forked children sharing the descriptor lose the lock too."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            os.ftruncate(fd, 0)  # still locked here: nobody reads a PID that has gone
        except OSError:
            pass
        finally:
            if fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()


def ensure_free(run_dir: str | Path) -> None:
    """`RunDirError` naming the holder's PID if another process holds ``run_dir``'s lock;
    a probe that keeps nothing (a directory that does not exist is free, and is not made)."""
    if Path(run_dir).is_dir():
        RunLock(run_dir).acquire().release()


def _holder(fd: int) -> str:
    """The PID written by the lock's holder ("unknown" if it has not written it yet)."""
    for _ in range(20):  # the holder writes its PID right after it takes the lock
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        if text.isdigit():
            return text
        time.sleep(0.01)
    return "unknown"
