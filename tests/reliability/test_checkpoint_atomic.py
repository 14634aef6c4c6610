"""Crash safety: failed saves, SIGKILL mid-save, interrupted replaces, rotation."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import safetensors.torch
import torch

import rlloop.checkpoint.store as ck
from rlloop.checkpoint import (
    CheckpointManager,
    is_checkpoint,
    load_checkpoint,
    save_checkpoint,
    save_replacing,
)


def state(step: int, n: int = 1000) -> dict[str, Any]:
    return {
        "module": {"w": torch.full((n,), float(step)), "b": torch.arange(10) + step},
        "optimizer": {"state": {0: {"m": torch.full((n,), -float(step))}}},
        "trainer": {"step": step},
    }


def check_consistent(path: Path) -> int:
    """Load ``path`` and check every part of it comes from the same save; return its step."""
    ckpt = load_checkpoint(path)
    step: int = ckpt.metadata["step"]
    c = ckpt.components
    assert c["trainer"]["step"] == step
    assert bool((c["module"]["w"] == step).all()) and bool((c["module"]["b"][0] == step).all())
    assert bool((c["optimizer"]["state"][0]["m"] == -step).all())
    if path.name.isdigit():
        assert int(path.name) == step
    return step


def dot_entries(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith("."))


def fail_on_call(monkeypatch: pytest.MonkeyPatch, obj: Any, name: str, call: int) -> None:
    """Make ``obj.name`` raise on its ``call``-th invocation (1-based)."""
    original, calls = getattr(obj, name), []

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == call:
            raise OSError("injected failure")
        return original(*args, **kwargs)

    monkeypatch.setattr(obj, name, wrapper)


@pytest.mark.parametrize(
    "failures",
    [
        [(safetensors.torch, "save_file", 2)],  # the writer fails after the first file
        [(ck, "_sync_and_hash", 2)],  # syncing the second file fails
        [(ck, "_write_file", 1)],  # writing the manifest fails
        [(ck, "_fsync_dir", 1)],  # syncing the temp dir fails
        [(ck, "_exchange", 1), (os, "rename", 1)],  # moving it into place fails
    ],
)
def test_failed_save_keeps_previous(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failures: list[tuple[Any, str, int]]
) -> None:
    manager = CheckpointManager(tmp_path, keep_last=2)
    manager.save(1, state(1), metadata={"step": 1})
    save_replacing(tmp_path / "best", state(1), metadata={"step": 1})
    saves: list[Callable[[], Path]] = [
        lambda: save_replacing(tmp_path / "best", state(2), metadata={"step": 2}),
        lambda: manager.save(2, state(2), metadata={"step": 2}),
    ]
    for save in saves:
        for target, name, call in failures:
            fail_on_call(monkeypatch, target, name, call)
        with pytest.raises(OSError, match="injected"):
            save()
        monkeypatch.undo()
    assert check_consistent(tmp_path / "best") == 1
    assert manager.all() == [tmp_path / "000000001"]
    assert manager.latest() == tmp_path / "000000001"
    assert check_consistent(tmp_path / "000000001") == 1
    assert sorted(p.name for p in tmp_path.iterdir() if is_checkpoint(p)) == ["000000001", "best"]
    assert dot_entries(tmp_path) == []  # a failed save cleans up after itself


def test_failed_plain_save_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fail_on_call(monkeypatch, safetensors.torch, "save_file", 2)
    with pytest.raises(OSError, match="injected"):
        save_checkpoint(tmp_path / "ckpt", state(1))
    assert list(tmp_path.iterdir()) == []


def test_replace_without_rename_exchange(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ck, "_exchange", lambda a, b: False)  # e.g. not Linux
    save_replacing(tmp_path / "best", state(1), metadata={"step": 1})
    save_replacing(tmp_path / "best", state(2), metadata={"step": 2})
    assert check_consistent(tmp_path / "best") == 2
    fail_on_call(monkeypatch, os, "rename", 2)  # moving the new one in fails: old goes back
    with pytest.raises(OSError, match="injected"):
        save_replacing(tmp_path / "best", state(3), metadata={"step": 3})
    monkeypatch.undo()
    assert check_consistent(tmp_path / "best") == 2
    assert dot_entries(tmp_path) == []


def test_interrupted_replace_is_restored(tmp_path: Path) -> None:
    """A crash between 'old aside' and 'new in place' leaves both in dot-dirs; no data lost."""
    dead_pid = 2**31 - 1  # above any pid_max, so never a live process
    save_checkpoint(tmp_path / "best", state(4), metadata={"step": 4})
    (tmp_path / "best").rename(tmp_path / f".best.old-{dead_pid}-00ff")
    save_checkpoint(tmp_path / "x", state(5), metadata={"step": 5})
    (tmp_path / "x").rename(tmp_path / f".best.tmp-{dead_pid}-0a0b")
    (tmp_path / f".000000009.tmp-{dead_pid}-0c").mkdir()  # a half-written save
    assert not any(is_checkpoint(p) for p in tmp_path.iterdir())
    CheckpointManager(tmp_path).save(1, state(1), metadata={"step": 1})
    assert check_consistent(tmp_path / "best") == 4
    assert dot_entries(tmp_path) == []


def test_rotation(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, keep_last=3)
    (tmp_path / "notes.txt").parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / "notes.txt").write_text("user file")
    save_replacing(tmp_path / "best", state(0), metadata={"step": 0})
    for step in range(8):
        assert manager.save(step, state(step), metadata={"step": step}).name == f"{step:09d}"
        assert len(manager.all()) == min(step + 1, 3)
    assert [p.name for p in manager.all()] == ["000000005", "000000006", "000000007"]
    assert (tmp_path / "notes.txt").exists() and is_checkpoint(tmp_path / "best")
    # A save older than the newest never deletes the newer ones.
    manager.save("3", state(3), metadata={"step": 3})
    assert [int(p.name) for p in manager.all()] == [3, 5, 6, 7]
    assert manager.latest() == tmp_path / "000000007"
    # Damaged newest: latest() falls back; the next save rotates old ones, keeps the new one.
    data = tmp_path / "000000007" / "module.safetensors"
    data.write_bytes(data.read_bytes()[:-1] + b"\x00")
    assert manager.latest() == tmp_path / "000000006"
    manager.save(8, state(8), metadata={"step": 8})
    assert [int(p.name) for p in manager.all()] == [6, 7, 8]
    assert manager.latest() == tmp_path / "000000008"
    one = CheckpointManager(tmp_path / "one", keep_last=1)
    for step in range(3):
        one.save(step, state(step), metadata={"step": step})
    assert [p.name for p in one.all()] == ["000000002"]
    with pytest.raises(ValueError, match="save_replacing"):
        manager.save("best", state(0))
    with pytest.raises(ValueError, match="keep_last"):
        CheckpointManager(tmp_path, keep_last=0)


# Imports torch once, then forks one writer per kill: each child saves big checkpoints in a
# loop until the test SIGKILLs it at a random moment; the parent reaps it and reports back.
WRITER = textwrap.dedent(
    """
    import os, sys, torch
    torch.set_num_threads(1)
    from rlloop.checkpoint import CheckpointManager, save_replacing
    root = sys.argv[1]
    manager = CheckpointManager(root, keep_last=2)
    for line in sys.stdin:
        pid = os.fork()
        if pid == 0:
            try:
                step = int(line)
                while True:
                    n = 1_000_000
                    s = {"module": {"w": torch.full((n,), float(step)),
                                    "b": torch.arange(10) + step},
                         "optimizer": {"state": {0: {"m": torch.full((n,), -float(step))}}},
                         "trainer": {"step": step}}
                    manager.save(step, s, metadata={"step": step})
                    save_replacing(root + "/best", s, metadata={"step": step})
                    print("saved", os.getpid(), step, flush=True)
                    step += 1
            finally:
                os._exit(1)
        os.waitpid(pid, 0)
        print("reaped", pid, flush=True)
    """
)


def test_sigkill_during_saves(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(ck.__file__).parents[2])}
    rng = random.Random(1234)
    manager = CheckpointManager(tmp_path, keep_last=2)
    next_step = 0
    with subprocess.Popen(
        [sys.executable, "-c", WRITER, str(tmp_path)],
        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    ) as zygote:
        assert zygote.stdin is not None and zygote.stdout is not None
        for run in range(8):
            delay = rng.uniform(0.0, 0.25)
            zygote.stdin.write(f"{next_step}\n")
            zygote.stdin.flush()
            saved = zygote.stdout.readline().split()
            assert saved[:1] == ["saved"], f"writer failed: {saved}"
            time.sleep(delay)
            os.kill(int(saved[1]), signal.SIGKILL)
            while not (line := zygote.stdout.readline()).startswith("reaped"):
                assert line, "writer exited"

            context = f"run {run}, delay {delay:.3f}s"
            latest = manager.latest()
            assert latest is not None, context
            step = check_consistent(latest)
            for path in tmp_path.iterdir():
                if is_checkpoint(path):  # every committed dir, "best" too, loads and agrees
                    check_consistent(path)
            assert is_checkpoint(tmp_path / "best"), context
            assert len(manager.all()) <= 3, context  # keep_last, +1 if killed before rotating
            next_step = step + 1
        zygote.stdin.close()
        assert zygote.wait(timeout=30) == 0

    manager.save(next_step, state(next_step), metadata={"step": next_step})
    assert dot_entries(tmp_path) == []  # leftovers of the killed writers are cleaned up
    assert len(manager.all()) == 2 and manager.latest() == manager.all()[-1]
