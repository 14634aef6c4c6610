"""A full disk ends a run with one line: which directory, what is free, what is needed.

Checkpoints are written to a temporary sibling and renamed into place, so a full disk
never damages the ones already there; the run can continue with ``--resume`` once there
is room again. A file that may not grow (``EFBIG``: the process's file-size limit,
``ulimit -f``, or the largest file its file system allows) ends the run the same way,
naming that limit instead of the free space.
"""

from __future__ import annotations

import errno
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlloop.errors import DiskFullError

try:
    import resource
except ImportError:  # not POSIX: no per-process file-size limit
    resource = None  # type: ignore[assignment]

DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


def disk_full_cause(exc: BaseException | None) -> OSError | None:
    """The out-of-space ``OSError`` behind ``exc`` (itself, a cause or a context), else None:
    a full disk or quota, or a file past its size limit."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS:
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def disk_full_error(cause: OSError, run_dir: Path, need: int, resume_hint: str) -> DiskFullError:
    """One line: the directory that is full, its free space, the space the run needs."""
    where = run_dir
    if cause.filename:
        failed = Path(str(cause.filename)).resolve()
        if not failed.is_relative_to(run_dir.resolve()):
            where = failed.parent  # e.g. a cache or temp folder outside the run
    if cause.errno == errno.EFBIG:
        return _file_too_large(where, need, resume_hint)
    try:
        free = f"{_size(shutil.disk_usage(where).free)} free"
    except OSError:
        free = "free space unknown"
    return DiskFullError(
        f"no space left on device in {where} ({free}; the next checkpoint needs about "
        f"{_size(need)}); free space there, then {resume_hint}")


def _file_too_large(where: Path, need: int, resume_hint: str) -> DiskFullError:
    """One line for EFBIG: the file-size limit that stopped a write, and how to lift it."""
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0] if resource is not None else None
    if limit is None or limit == resource.RLIM_INFINITY:  # the file system's own maximum
        return DiskFullError(
            f"file too large in {where}: its file system allows no larger file (the next "
            f"checkpoint needs about {_size(need)}); move the run to another file system, "
            f"then {resume_hint}")
    return DiskFullError(
        f"file too large in {where}: this process may write files of at most {_size(limit)} "
        f"(its file-size limit, `ulimit -f`; the next checkpoint needs about {_size(need)}); "
        f"raise the limit (`ulimit -f unlimited`), then {resume_hint}")


def output_disk_full(path: Path, need: int) -> DiskFullError:
    """One line for an output file (an export) that did not fit: where, what is free there,
    what it needs."""
    try:
        free = f"{_size(shutil.disk_usage(path.parent).free)} free"
    except OSError:
        free = "free space unknown"
    return DiskFullError(f"no space left on device for -o {path} ({free}; it needs "
                         f"about {_size(need)}); free space there or write it elsewhere")


def checkpoint_bytes(paths: Sequence[Path], algorithm: Any) -> int:
    """Bytes a checkpoint of this run takes: the first of ``paths`` that can be measured,
    else the tensors of ``algorithm``'s state."""
    for path in paths:
        try:
            return sum(_disk_bytes(f) for f in path.iterdir() if f.is_file())
        except OSError:
            continue
    try:
        return _tensor_bytes(algorithm.get_state()) if algorithm is not None else 0
    except Exception:  # an estimate for a message; never hide the disk-full error behind it
        return 0


def _disk_bytes(file: Path) -> int:
    """What ``file`` takes on its device: whole blocks, not just its length."""
    st = file.stat()
    return max(st.st_size, getattr(st, "st_blocks", 0) * 512)


def _tensor_bytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    if isinstance(value, Mapping):
        return sum(_tensor_bytes(v) for v in value.values())
    if isinstance(value, list | tuple):
        return sum(_tensor_bytes(v) for v in value)
    return 0


def _size(n: float) -> str:
    if n < 1024:
        return f"{n:.0f} bytes"
    units = iter(("KiB", "MiB", "GiB"))
    unit = next(units)
    while (n := n / 1024) >= 1024 and unit != "GiB":
        unit = next(units)
    return f"{n:.1f} {unit}"
