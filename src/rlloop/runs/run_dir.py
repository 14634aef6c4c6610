"""The run directory before a session opens it: its default name, what a new run refuses to
write over, and whether it holds a checkpoint to resume from."""

from __future__ import annotations

import contextlib
import itertools
import re
import time
from collections.abc import Iterator
from pathlib import Path

from rlloop.checkpoint import CheckpointManager
from rlloop.config.run_config import RunConfig
from rlloop.errors import RunDirError
from rlloop.system.run_files import MEMBERS, check_members


def default_run_dir(config: RunConfig) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    # One path component whatever the id holds ("ale_py:ALE/Pong-v5" -> ale_py-ALE-Pong-v5).
    env = re.sub(r"[^\w.-]+", "-", config.env)
    return Path("runs") / f"{config.algo}-{env}-{stamp}"


def claim_default_run_dir(config: RunConfig) -> Path:
    """:func:`default_run_dir`, created here so that no other run takes it: runs started
    in the same second (two seeds launched together) get ``-2``, ``-3``, ... suffixes."""
    base = default_run_dir(config)
    for k in itertools.count(1):
        path = base if k == 1 else base.with_name(f"{base.name}-{k}")
        try:
            path.mkdir(parents=True)
        except FileExistsError:
            continue
        return path
    raise AssertionError("unreachable")


@contextlib.contextmanager
def claimed_default_run_dir(config: RunConfig) -> Iterator[Path]:
    """:func:`claim_default_run_dir` for the block; when the block raises, the directory
    (and ``runs/`` if this made it) is removed if still empty: the run never started."""
    made = [p for p in reversed(default_run_dir(config).parents) if not p.exists()]
    path = claim_default_run_dir(config)
    try:
        yield path
    except BaseException:
        for p in (path, *reversed(made)):
            with contextlib.suppress(OSError):
                p.rmdir()
        raise


def refuse_existing_run(path: Path, *, other_files: bool = False) -> None:
    """Refuse a run directory that holds a run, or (``other_files``) anything a new run
    would write over or mix into: a new run starts in a new or empty directory."""
    if (path / "config.yaml").exists():
        raise RunDirError(f"{path} already holds a run; resume it with --resume {path} "
                          "or choose another --run-dir")
    if not other_files or (not path.exists() and not path.is_symlink()):
        return
    if not path.is_dir():
        raise RunDirError(f"--run-dir {path} is an existing file, not a directory; pick "
                          "another --run-dir")
    check_members(path)  # a planted link is named as one
    # Names the run writes (report.md, best/, metrics.jsonl, ...); other files (a shell's
    # `> run/train.log`, a job script, .gitkeep) are left alone and stay.
    found = [name for name in MEMBERS if name != ".lock" and (path / name).exists()]
    if found:
        shown = ", ".join(found[:3]) + (", ..." if len(found) > 3 else "")
        raise RunDirError(f"--run-dir {path} holds {shown} but no run: a new run would write "
                          "over them; choose a new or empty directory, or move them")


def has_checkpoint(run_dir: Path) -> bool:
    """Whether ``resume`` has a checkpoint to start from (``best/`` alone is not one)."""
    return CheckpointManager(run_dir / "checkpoints").latest() is not None


def no_checkpoint_error(run_dir: Path) -> RunDirError:
    root = run_dir / "checkpoints"
    saved = [p for p in root.iterdir() if re.fullmatch(r"[0-9]+", p.name) and p.is_dir()
             ] if root.is_dir() else []
    if saved:  # it saved, but what it saved cannot be loaded
        return RunDirError(f"{run_dir} holds a run whose checkpoints ({len(saved)} in {root}) "
                           "are all damaged or incomplete (no manifest.json, or failing their "
                           "checks: see any warnings above), so it cannot be resumed; put "
                           "back an intact copy of that folder (from a backup of the run), "
                           "or start over: remove the directory or pick another --run-dir")
    return RunDirError(f"{run_dir} holds a run with no loadable checkpoint (it stopped before "
                       "its first save), so it cannot be resumed; start over: remove the "
                       "directory or pick another --run-dir")
