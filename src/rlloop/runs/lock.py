"""One training process per run directory: an advisory ``flock`` on the run directory.

Two trainers writing one run directory interleave ``metrics.jsonl``, mix the checkpoints
of two seeds and rewrite each other's ``config.yaml``; the second one is refused instead.
The kernel drops a ``flock`` when its holder exits, however it exits, so a trainer that
was SIGKILLed leaves no stale lock: the next one takes it over.

The lock is taken on the directory itself (an ``O_DIRECTORY`` descriptor), which no
"stale lock" cleanup can unlink from under a live trainer: a lock on ``<run>/.lock``
alone was sidestepped by ``rm <run>/.lock``, after which a second trainer locked a new
file of the same name and both wrote the run. ``<run>/.lock`` is locked as well (an older
rlloop locks only that file) and holds the holder's PID for the error message; where the
file was removed, the kernel's lock table names the holder. On a file system without
directory locks (NFS emulates ``flock`` with POSIX locks, which need a file open for
writing) the file's lock is the only one. Readers (``rlloop eval``) take no lock:
checkpoints are replaced atomically under them.
"""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path
from types import TracebackType

from rlloop.errors import RunDirError
from rlloop.system.run_files import refuse_hard_link

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
        self._fd: int | None = None  # the PID file, locked too
        self._dir_fd: int | None = None  # None where the file system has no directory locks

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> RunLock:
        """Create the run directory if needed and lock it; `RunDirError` if another holds it."""
        if self._fd is not None:
            return self
        self.run_dir.mkdir(parents=True, exist_ok=True)
        dir_fd = _lock_directory(self.run_dir, self.path)
        try:
            fd = self._lock_pid_file()
        except BaseException:
            if dir_fd is not None:
                os.close(dir_fd)  # closing it drops its lock
            raise
        self._fd, self._dir_fd = fd, dir_fd
        return self

    def _lock_pid_file(self) -> int:
        """Open, lock and fill ``.lock`` with this process's PID; its descriptor."""
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
                    raise _in_use(self.run_dir, self.path, fd) from None
            refuse_hard_link(self.path, os.fstat(fd))  # the PID is written in place
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def release(self) -> None:
        """Unlock; idempotent. Forked children sharing the descriptors lose the lock too."""
        fd, self._fd = self._fd, None
        dir_fd, self._dir_fd = self._dir_fd, None
        if fd is None:
            return
        try:
            os.ftruncate(fd, 0)  # still locked here: nobody reads a PID that has gone
        except OSError:
            pass
        finally:
            for held in (fd, dir_fd):  # the directory last: it is the lock that counts
                if held is None:
                    continue
                if fcntl is not None:
                    fcntl.flock(held, fcntl.LOCK_UN)
                os.close(held)

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()


#: What ``flock`` on a directory raises where the file system cannot lock one.
_NO_DIRECTORY_LOCKS = frozenset({errno.EBADF, errno.EINVAL, errno.ENOLCK, errno.EOPNOTSUPP,
                                 errno.ENOTSUP})


def _lock_directory(run_dir: Path, lock_file: Path) -> int | None:
    """A descriptor of ``run_dir`` holding its exclusive ``flock``; None where the platform
    or file system has no directory locks. `RunDirError` if another process holds it."""
    if fcntl is None:
        return None
    dir_fd = os.open(run_dir, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        fcntl.flock(dir_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        error = _in_use(run_dir, lock_file, dir_fd)
        os.close(dir_fd)
        raise error from None
    except OSError as e:
        os.close(dir_fd)
        if e.errno in _NO_DIRECTORY_LOCKS:
            return None
        raise
    except BaseException:
        os.close(dir_fd)
        raise
    return dir_fd


def _in_use(run_dir: Path, lock_file: Path, locked_fd: int) -> RunDirError:
    return RunDirError(f"{run_dir} is in use by another rlloop process (PID "
                       f"{_holder(lock_file, locked_fd)} holds its lock); wait for it to end "
                       "or stop it, or choose another --run-dir")


def ensure_free(run_dir: str | Path) -> None:
    """`RunDirError` naming the holder's PID if another process holds ``run_dir``'s lock;
    a probe that keeps nothing (a directory that does not exist is free, and is not made)."""
    if Path(run_dir).is_dir():
        RunLock(run_dir).acquire().release()


def _holder(lock_file: Path, locked_fd: int) -> str:
    """The PID of the lock's holder: written in ``lock_file`` right after it takes the lock,
    else (the file was removed or replaced) the kernel's record of the ``flock`` on
    ``locked_fd``'s file, else "unknown"."""
    try:
        fd = os.open(lock_file, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        fd = None
    if fd is not None:
        try:
            for _ in range(20):  # the holder writes its PID right after it takes the lock
                text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
                if text.isdigit():
                    return text
                time.sleep(0.01)
        finally:
            os.close(fd)
    return _flock_holder(locked_fd) or "unknown"


def _flock_holder(fd: int) -> str | None:
    """The PID that Linux's ``/proc/locks`` gives for a ``flock`` on ``fd``'s file, if any."""
    st = os.fstat(fd)
    inode = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as f:
            for line in f:
                # "1: FLOCK  ADVISORY  WRITE 4242 fe:00:260072 0 EOF" (a waiter: "1: -> FLOCK")
                fields = line.split()
                if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == inode:
                    return fields[4] if fields[4].isdigit() else None
    except OSError:  # not Linux
        pass
    return None
