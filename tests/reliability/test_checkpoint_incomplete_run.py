"""A run directory copied with an interruption: checkpoint directories without their
``manifest.json``. A resume replaces them when it gets there instead of crashing, and
``rlloop eval`` with a damaged ``best/`` evaluates the newest intact checkpoint instead.
A symbolic link planted at a checkpoint's name is replaced too, never followed."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

from rlloop.checkpoint import MANIFEST, CheckpointManager, load_checkpoint, verify_checkpoint

from ._cli import one_error_line, run, train_args


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """1024 env steps: checkpoints at 512 (before any eval) and 1024, best/ from the eval
    at 1024."""
    root = tmp_path_factory.mktemp("trained")
    out = run(train_args(root / "run", 1024, "--seed", "5", "--set", "checkpoint_every=1",
                         "--set", "eval_every=2", "--set", "keep_checkpoints=5"), root)
    assert out.returncode == 0, out.stderr
    return root / "run"


def copy_of(trained: Path, tmp_path: Path) -> Path:
    run_dir = tmp_path / "run"
    shutil.copytree(trained, run_dir)
    return run_dir


def steps(path: Path) -> int:
    return int(load_checkpoint(path).components["trainer"]["counters"]["env/steps"])


def test_resume_replaces_checkpoints_without_manifest(trained, tmp_path):
    run_dir = copy_of(trained, tmp_path)
    (run_dir / "checkpoints" / "000001024" / MANIFEST).unlink()
    (run_dir / "best" / MANIFEST).unlink()
    manager = CheckpointManager(run_dir / "checkpoints")
    assert load_checkpoint(manager.latest()).components["trainer"]["best_eval_return"] is None

    # From 512: the save at 1024 and the first best both land on a manifest-less directory.
    out = run(["train", "ppo", "--resume", str(run_dir), "--quiet", "--total-env-steps", "2048"],
              tmp_path)
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr
    assert steps(run_dir / "checkpoints" / "000001024") == 1024
    assert [steps(p) for p in manager.all()] == [512, 1024, 1536, 2048]
    verify_checkpoint(run_dir / "best")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["best_eval_return"] is not None


def test_resume_replaces_a_link_planted_at_its_next_checkpoint(trained, tmp_path):
    run_dir = copy_of(trained, tmp_path)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "notes.txt").write_text("precious")
    (run_dir / "checkpoints" / "000001536").symlink_to(victim)

    out = run(["train", "ppo", "--resume", str(run_dir), "--quiet", "--total-env-steps", "2048"],
              tmp_path)
    assert out.returncode == 0, out.stderr
    line = one_error_line(out.stderr)
    link = run_dir / "checkpoints" / "000001536"
    assert line.startswith(f"replacing {link}: it is a symbolic link"), line
    manager = CheckpointManager(run_dir / "checkpoints")
    assert [steps(p) for p in manager.all()] == [512, 1024, 1536, 2048]
    assert not link.is_symlink()
    assert [p.name for p in victim.iterdir()] == ["notes.txt"]
    assert (victim / "notes.txt").read_text() == "precious"


@pytest.mark.parametrize("target", ["missing", "file", "checkpoint"])
def test_a_save_replaces_a_link_at_its_name_whatever_it_points_to(trained, tmp_path, caplog,
                                                                  target):
    victim = {"missing": tmp_path / "gone", "file": tmp_path / "victim.txt",
              "checkpoint": tmp_path / "victim"}[target]
    if target == "file":
        victim.write_text("precious")
    elif target == "checkpoint":
        shutil.copytree(trained / "best", victim)
    before = sorted((p.name, p.read_bytes()) for p in victim.iterdir()) if target == \
        "checkpoint" else victim.exists() and victim.read_bytes()
    manager = CheckpointManager(tmp_path / "checkpoints")
    manager.root.mkdir()
    manager.path_for(512).symlink_to(victim)
    with caplog.at_level(logging.WARNING):
        saved = manager.save(512, {"x": {"step": 512}})
    assert [r.message for r in caplog.records if "symbolic link" in r.message] != []
    assert not saved.is_symlink() and load_checkpoint(saved).components == {"x": {"step": 512}}
    assert [p.name for p in manager.root.iterdir()] == ["000000512"]  # no leftover
    after = sorted((p.name, p.read_bytes()) for p in victim.iterdir()) if target == \
        "checkpoint" else victim.exists() and victim.read_bytes()
    assert after == before


@pytest.mark.parametrize("damage", ["flip a byte", "no manifest"])
def test_eval_falls_back_from_a_damaged_best(trained, tmp_path, damage):
    run_dir = copy_of(trained, tmp_path)
    if damage == "no manifest":
        (run_dir / "best" / MANIFEST).unlink()
    else:
        data = run_dir / "best" / "algorithm.safetensors"
        raw = bytearray(data.read_bytes())
        raw[-5] ^= 0xFF
        data.write_bytes(bytes(raw))
    out = run(["eval", str(run_dir), "--episodes", "2", "--json"], tmp_path)
    assert out.returncode == 0, out.stderr
    line = one_error_line(out.stderr)
    newest = run_dir / "checkpoints" / "000001024"
    assert line.startswith("rlloop: warning:") and "damaged" in line and str(newest) in line
    assert json.loads(out.stdout.strip().splitlines()[-1])["episodes"] == 2


def test_eval_with_no_intact_checkpoint_is_one_error_line(trained, tmp_path):
    run_dir = copy_of(trained, tmp_path)
    for path in [run_dir / "best", *CheckpointManager(run_dir / "checkpoints").all()]:
        (path / MANIFEST).write_text("{}")
    out = run(["eval", str(run_dir), "--episodes", "2"], tmp_path)
    assert out.returncode == 2
    line = out.stderr.strip().splitlines()[-1]  # after a warning per skipped checkpoint
    assert line.startswith("rlloop: error:") and "no intact checkpoint" in line, out.stderr
