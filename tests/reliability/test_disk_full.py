"""A full disk, for real: a small tmpfs mounted under the test's folder (root only; the
tests skip where mounting is not permitted). The run ends with one line naming the
directory and the space needed and exit code 3; the checkpoints already written stay
intact, no temporary file is left, and the run resumes once there is room. A file-size
limit (``ulimit -f``) ends it the same way."""

from __future__ import annotations

import resource
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlloop.checkpoint import CheckpointManager, load_checkpoint, verify_checkpoint
from rlloop.cli.main import EXIT_DISK_FULL

from ._cli import cli_environ, one_error_line, rlloop, run, train_args


def _mount(point: Path, size: str) -> None:
    out = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(point)],
                         capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {out.stderr.strip()}")


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    point = tmp_path / "disk"
    point.mkdir()
    _mount(point, "800k")  # room for 4 PPO CartPole checkpoints of ~172 KiB
    try:
        yield point
    finally:
        subprocess.run(["umount", "-l", str(point)], check=False)


def leftovers(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if ".tmp" in p.name]


def test_disk_full_ends_the_run_with_one_line(small_disk: Path, tmp_path: Path) -> None:
    run_dir = small_disk / "run"
    out = run(train_args(run_dir, 10**9, "--set", "checkpoint_every=1", "--set", "eval_every=1",
                         "--set", "keep_checkpoints=3"), tmp_path)
    assert out.returncode == EXIT_DISK_FULL == 3, out.stderr
    line = one_error_line(out.stderr)
    assert line.startswith(f"rlloop: error: no space left on device in {run_dir} ("), line
    assert "the next checkpoint needs about 1" in line and "KiB" in line, line
    assert f"--resume {run_dir}" in line, line

    manager = CheckpointManager(run_dir / "checkpoints")
    assert manager.all(), "no checkpoint was written before the disk filled up"
    for path in [*manager.all(), run_dir / "best"]:
        verify_checkpoint(path)
    assert leftovers(run_dir) == []

    # Room again: the run continues from its newest checkpoint.
    subprocess.run(["mount", "-o", "remount,size=8m", str(small_disk)], check=True)
    steps = load_checkpoint(manager.latest()).components["trainer"]["counters"]["env/steps"]
    done = run(["train", "ppo", "--resume", str(run_dir), "--quiet",
                "--total-env-steps", str(steps + 512)], tmp_path)
    assert done.returncode == 0, done.stderr
    assert load_checkpoint(manager.latest()).components["trainer"]["counters"]["env/steps"] \
        == steps + 512


def test_mlflow_store_on_a_full_disk_leaves_no_partial_copy(small_disk: Path) -> None:
    from rlloop.logging import MlflowSink, sqlite_tracking_uri

    (small_disk / "filler").write_bytes(b"\0" * 800 * 1024)  # less room than a new store needs
    with pytest.raises(Exception, match="full"):
        MlflowSink(sqlite_tracking_uri(small_disk / "mlflow.db"), "exp")
    assert leftovers(small_disk) == []


def _file_size_limit(limit: int) -> None:
    """In the child: writes past ``limit`` bytes fail with EFBIG (SIGXFSZ ignored, as
    Python ignores it; the signal would kill the process first)."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


def test_file_size_limit_ends_the_run_like_a_full_disk(tmp_path: Path) -> None:
    from small_runs import train_ppo

    run_dir = train_ppo(tmp_path / "run", steps=512)  # checkpoints of ~170 KiB
    manager = CheckpointManager(run_dir / "checkpoints")
    saved = manager.all()
    # The resume's checkpoint has a 125 KiB file; its other writes are smaller than 64 KiB.
    out = subprocess.run(rlloop("train", "ppo", "--resume", str(run_dir), "--quiet",
                                "--total-env-steps", "1024"),
                         env=cli_environ(), cwd=tmp_path, capture_output=True, text=True,
                         timeout=240, preexec_fn=lambda: _file_size_limit(64 * 1024))
    assert out.returncode == EXIT_DISK_FULL, out.stderr
    line = one_error_line(out.stderr)
    assert line.startswith(f"rlloop: error: file too large in {run_dir}: "), line
    assert "at most 64.0 KiB" in line and "ulimit -f" in line, line
    assert f"--resume {run_dir}" in line, line
    assert manager.all() == saved
    for path in [*saved, run_dir / "best"]:
        verify_checkpoint(path)
    assert leftovers(run_dir) == []


def test_an_export_to_a_full_disk_is_one_line_exit_3(small_disk: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """The exported file did not fit: an OSError (ENOSPC) and exit 1 instead of the full
    disk's one line and exit 3 that a training run gets."""
    from small_runs import train_ppo

    from rlloop.cli.main import main

    run_dir = train_ppo(tmp_path / "run", steps=256)
    (small_disk / "filler").write_bytes(b"\0" * 800 * 1024)  # no room for the export
    out = small_disk / "policy.onnx"
    code = main(["export", str(run_dir), "--format", "onnx", "-o", str(out)])
    line = one_error_line(capsys.readouterr().err)
    assert code == EXIT_DISK_FULL, line
    assert line.startswith(f"rlloop: error: no space left on device for -o {out} ("), line
    assert "free space there or write it elsewhere" in line, line
    assert not out.exists() and leftovers(small_disk) == []
