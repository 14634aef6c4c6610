"""Checkpoint manager (see the package docstring)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from rlloop.checkpoint.format import (
    _STEP_RE,
    Checkpoint,
    CheckpointCorruptError,
    CheckpointNotFoundError,
    _log,
    restoring,
)
from rlloop.checkpoint.store import (
    _sibling,
    is_checkpoint,
    load_checkpoint,
    save_replacing,
    verify_checkpoint,
)

# ---------------------------------------------------------------- numbered checkpoints


class CheckpointManager:
    """Step-numbered checkpoints ``root/000012345`` with rotation.

    The manager owns the all-digit names in ``root``; other entries (such as ``root/best``,
    written with :func:`save_replacing`) are never listed, rotated or deleted.
    """

    def __init__(self, root: str | Path, keep_last: int = 3) -> None:
        if keep_last < 1:
            raise ValueError(f"keep_last must be >= 1, got {keep_last}")
        self.root, self.keep_last = Path(root), keep_last

    def path_for(self, name: str | int) -> Path:
        """``root/<name>``; step numbers are zero-padded to 9 digits so they sort by name."""
        if isinstance(name, bool) or not (
            (isinstance(name, int) and name >= 0)
            or (isinstance(name, str) and _STEP_RE.fullmatch(name))
        ):
            raise ValueError(f"checkpoint name {name!r} must be a step number; use "
                             "save_replacing() for fixed names such as 'best'")
        return self.root / f"{int(name):09d}"

    def save(
        self, name: str | int, components: Mapping[str, Any], *,
        metadata: Mapping[str, Any] | None = None,
    ) -> Path:
        """Commit a checkpoint, then delete the oldest beyond ``keep_last``."""
        path = self.path_for(name)
        self.root.mkdir(parents=True, exist_ok=True)
        # Also cleans leftovers in root; a step directory without a manifest (an interrupted
        # copy of a run) holds nothing loadable, so the new checkpoint takes its place.
        save_replacing(path, components, metadata=metadata, replace_incomplete=True)
        self._rotate(path)
        return path

    def all(self) -> list[Path]:
        """Committed checkpoints, oldest first."""
        if not self.root.is_dir():
            return []
        found = [p for p in self.root.iterdir() if _STEP_RE.fullmatch(p.name) and is_checkpoint(p)]
        return sorted(found, key=lambda p: int(p.name))

    def latest(self) -> Path | None:
        """The newest checkpoint that verifies; damaged or partial ones are skipped."""
        for path in reversed(self.all()):
            try:
                verify_checkpoint(path)
                return path
            except (CheckpointCorruptError, CheckpointNotFoundError) as e:
                _log.warning("skipping checkpoint %s: %s", path, e)
        return None

    def load_latest(self, *, expected_components: Iterable[str] | None = None,
                    restore: Callable[[Checkpoint], None] | None = None) -> Checkpoint | None:
        """Load the newest loadable checkpoint in one pass (None if there is none).

        ``restore`` applies a loaded checkpoint to the caller's objects; a value they cannot
        take (see :func:`restoring`) makes the checkpoint a damaged one: it is skipped with
        a warning, and the next older one is applied over what it left.
        """
        for path in reversed(self.all()):
            try:
                ckpt = load_checkpoint(path, expected_components=expected_components)
                if restore is not None:
                    with restoring(path):
                        restore(ckpt)
                return ckpt
            except (CheckpointCorruptError, CheckpointNotFoundError) as e:
                _log.warning("skipping checkpoint %s: %s", path, e)
        return None

    def _rotate(self, just_saved: Path) -> None:
        # Only checkpoints older than the one just committed are deleted, so the newest valid
        # one always survives, even if names were saved out of order.
        paths = self.all()
        older = [p for p in paths if int(p.name) < int(just_saved.name)]
        for path in older[: max(0, len(paths) - self.keep_last)]:
            doomed = _sibling(path, "del")  # rename first: a half-deleted dir is never visible
            try:
                os.rename(path, doomed)
            except OSError as e:  # e.g. another process rotated it already
                _log.warning("could not delete old checkpoint %s: %s", path, e)
                continue
            shutil.rmtree(doomed, ignore_errors=True)
