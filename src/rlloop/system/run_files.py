"""Writing into a run directory without ever following a symbolic link.

A run directory may come from someone else (a copied or downloaded run that a user
resumes). A member replaced by a link (``report.md -> ~/.bashrc``) must not make rlloop
write through it. So every run file is written aside under a fresh name (created with
``O_EXCL | O_NOFOLLOW``) and renamed over its target, which replaces a link instead of
following it; files that are appended to are opened with ``O_NOFOLLOW``; and before a
run writes anything, :func:`check_members` refuses members that are links (which could
lead outside the directory) (stores and folders such as ``mlflow.db`` and ``checkpoints/``
cannot be renamed over).

A hard link is another name of the same file, possibly outside the run directory (made by
``cp -al`` or planted). Renaming over it leaves the other name alone, but a file written in
place (:data:`IN_PLACE`: appended to, truncated, a database's pages) would change it too.
Such a member is refused, naming the fix, rather than copied: a copy made by rlloop would
give the file's content (someone else's file, maybe) a new owner and mode.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO

import psutil

from rlloop.errors import RunDirError

MEMBERS = (
    "config.yaml", "run.json", "metrics.jsonl", "metrics.params.json", "report.md",
    "summary.json", "report.html", "learning_curves.png", "losses.png", "diagnostics.png",
    "throughput.png", "policy.onnx", "policy.pt", "video.mp4", "mlflow.db", "checkpoints", "best",
    "tensorboard", "artifacts", "profile", "wandb", ".lock",
    "mlflow.db-journal", "mlflow.db-wal", "mlflow.db-shm",  # SQLite's side files
)
"""Every name rlloop writes directly inside a run directory."""

IN_PLACE = ("metrics.jsonl", "mlflow.db", "mlflow.db-journal", "mlflow.db-wal",
            "mlflow.db-shm", ".lock")
"""The members written in place rather than renamed over: no second hard link allowed."""

#: Members whose whole tree others write into (MLflow's artifact copies): no link anywhere
#: below them either.
TREES = ("artifacts", "profile")

_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
_APPEND = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def check_members(run_dir: Path) -> None:
    """Raise ``RunDirError`` if a member of ``run_dir`` is a symbolic link, or one written
    in place has another hard link.

    Members are direct children, so only a link can make one resolve outside the run.
    """
    for name in MEMBERS:
        refuse_link(run_dir / name)
    for name in IN_PLACE:
        refuse_hard_link(run_dir / name)
    for name in TREES:
        for link in links_under(run_dir / name):
            refuse_link(link)


def refuse_link(member: Path, where: str = "a run directory",
                fix: str = "use another --run-dir") -> None:
    """``RunDirError`` if ``member`` (of ``where``) is a symbolic link."""
    if member.is_symlink():
        raise RunDirError(f"{member} is a symbolic link (to {os.readlink(member)}); rlloop "
                          f"never writes through links in {where}: remove the link or {fix}")


def refuse_hard_link(path: Path, st: os.stat_result | None = None) -> None:
    """``RunDirError`` if the regular file ``path`` (``st``: its open descriptor's stat;
    default: the name's, none if missing) has another hard link, which writing it in place
    would change too."""
    if st is None:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return
    if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
        raise RunDirError(
            f"{path} has {st.st_nlink} hard links (names of one file, maybe outside this "
            f"directory); rlloop writes it in place, which would change them all: give it a "
            f"file of its own (cp {path} {path}.copy && mv {path}.copy {path}) or use "
            f"another --run-dir")


def links_under(folder: Path) -> Iterator[Path]:
    """The symbolic links anywhere below ``folder`` (none are followed; none if it is no
    folder)."""
    for parent, dirs, files in os.walk(folder):
        yield from (Path(parent, e) for e in (*dirs, *files) if Path(parent, e).is_symlink())


def check_output_file(out: Path, run_dirs: Iterable[Path], allowed: Iterable[str] = (),
                      option: str = "-o") -> None:
    """``RunDirError`` unless ``out`` can be written as a new or replaced file: its
    directory exists, it is no directory, and it is none of the own files of the runs
    named or of any run directory it lies in (an output over ``config.yaml`` or
    ``metrics.jsonl`` destroyed the run); ``allowed`` names members that may be written."""
    if out.is_dir():
        raise RunDirError(f"{option} {out} is a directory; name the file to write")
    if not out.parent.is_dir():
        raise RunDirError(f"{option} {out}: the directory {out.parent} does not exist; create it "
                          "or write elsewhere")
    target = out.resolve()
    inside = [p for p in target.parents if (p / "config.yaml").is_file()]
    for run in [*run_dirs, *inside]:
        root = run.resolve()
        if target.is_relative_to(root) and target != root:
            member = target.relative_to(root).parts[0]
            if member in MEMBERS and member not in set(allowed):
                raise RunDirError(f"{option} {out} would overwrite {run}'s own {member}; write "
                                  "the output elsewhere")


def write_file(path: Path, data: str | bytes) -> None:
    """Atomically write ``data`` to ``path``: aside under a fresh name, then renamed over it.

    A link at ``path`` is replaced, never followed; a reader sees the old or the new file.
    """
    raw = data.encode("utf-8") if isinstance(data, str) else data
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, _CREATE, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def open_append(path: Path) -> IO[str]:
    """``path`` opened for appending text, line-buffered; a link there (symbolic, or
    another hard link of the file) is refused."""
    try:
        fd = os.open(path, _APPEND, 0o666)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise RunDirError(f"{path} is a symbolic link; rlloop never writes through links "
                              "in a run directory: remove the link") from None
        raise
    try:
        refuse_hard_link(path, os.fstat(fd))  # the file opened, whatever the name holds now
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "a", encoding="utf-8", buffering=1)


#: The file that marks a tuning study's directory (``rlloop tune``).
STUDY_FILE = "tune.json"


def refuse_study_dir(path: Path) -> None:
    """RunDirError when ``path`` holds a tuning study: a training run there would mix its
    files (config, checkpoints, report, ``best/``) with the study's."""
    if (path / STUDY_FILE).is_file():
        raise RunDirError(f"{path} holds a tuning study (rlloop tune), not a training run; "
                          f"train in another --run-dir (continue the study with `rlloop tune "
                          f"--resume {path}`)")


def check_run_dir(run_dir: str | Path) -> Path:
    """``run_dir`` as a Path if it holds a run (its ``config.yaml``), else RunDirError."""
    if not str(run_dir).strip():  # Path("") is the working directory
        raise RunDirError("the run directory is empty; pass a directory made by "
                          "`rlloop train`, e.g. runs/<run-name>")
    path = Path(run_dir)
    if not (path / "config.yaml").is_file():
        raise RunDirError(f"{path} is not an rlloop run directory (no config.yaml); pass a "
                          "directory made by `rlloop train`, e.g. runs/<run-name>")
    return path


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` (this one included) still runs: the owner of a leftover
    temp file or directory named by its pid."""
    return pid == os.getpid() or psutil.pid_exists(pid)
