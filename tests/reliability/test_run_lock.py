"""One trainer per run directory: a second ``rlloop train`` into a live run, or a
``--resume`` of it, is refused with exit 2 and the holder's PID; the lock of a SIGKILLed
trainer is taken over; ``rlloop eval`` of a live run keeps working; removing ``.lock`` lets
no second trainer in."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest
from proc_utils import wait_for

from rlloop.checkpoint import CheckpointManager, is_checkpoint, load_checkpoint
from rlloop.errors import RunDirError
from rlloop.runs.lock import LOCK_FILE, RunLock
from rlloop.runs.start import resume

from ._cli import one_error_line, rows, run, start, train_args


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err


def _kill_all(procs: list[subprocess.Popen[str]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()


def test_second_trainer_is_refused_and_eval_of_the_live_run_works(tmp_path, cli_in_process):
    run_dir = tmp_path / "run"
    # Two trainers started together into one fresh directory: exactly one gets it.
    procs = [start(train_args(run_dir, 10**9, "--seed", str(seed), "--set", "eval_every=1"),
                   tmp_path) for seed in (1, 2)]
    try:
        wait_for(lambda: any(p.poll() is not None for p in procs), procs[0],
                 "one to be refused")
        loser = next(p for p in procs if p.poll() is not None)
        winner = next(p for p in procs if p is not loser)
        _, err = loser.communicate()
        assert loser.returncode == 2, err
        line = one_error_line(err)
        assert line.startswith("rlloop: error:") and f"PID {winner.pid}" in line, line

        wait_for(lambda: is_checkpoint(run_dir / "best") and len(rows(run_dir)) >= 2, winner,
                 "the winner's first eval")
        config = (run_dir / "config.yaml").read_bytes()
        # The later commands in this process (the live run's lock is another process's).
        for refused in (train_args(run_dir, 10**9, "--seed", "3"),  # a new run, a resume
                        ["train", "ppo", "--resume", str(run_dir), "--quiet"]):
            out = cli_in_process(refused)
            assert out.returncode == 2, out.stderr
            assert f"PID {winner.pid}" in one_error_line(out.stderr)
        assert (run_dir / "config.yaml").read_bytes() == config  # not rewritten
        ev = cli_in_process(["eval", str(run_dir), "--episodes", "2", "--json"])
        assert ev.returncode == 0, ev.stderr
        assert json.loads(ev.stdout.strip().splitlines()[-1])["episodes"] == 2
        _stop(winner)
    finally:
        _kill_all(procs)
    assert json.loads((run_dir / "run.json").read_text())["algo"] == "ppo"
    steps = [r["step"] for r in rows(run_dir) if "losses/policy" in r]
    assert steps == sorted(set(steps))  # one writer: no interleaved rows


def test_lock_of_a_killed_trainer_is_taken_over(tmp_path):
    run_dir = tmp_path / "run"
    proc = start(train_args(run_dir, 10**9, "--set", "checkpoint_every=1"), tmp_path)
    manager = CheckpointManager(run_dir / "checkpoints")
    try:
        wait_for(lambda: manager.latest() is not None, proc, "the first checkpoint")
    finally:
        _kill_all([proc])
    assert (run_dir / LOCK_FILE).read_text().strip() == str(proc.pid)  # left behind

    steps = load_checkpoint(manager.latest()).components["trainer"]["counters"]["env/steps"]
    done = run(["train", "ppo", "--resume", str(run_dir), "--quiet",
                "--total-env-steps", str(steps + 512)], tmp_path)
    assert done.returncode == 0, done.stderr
    final = load_checkpoint(manager.latest()).components["trainer"]["counters"]["env/steps"]
    assert final == steps + 512
    assert (run_dir / LOCK_FILE).read_text() == ""  # released at the end


def test_removing_the_lock_file_lets_no_second_trainer_in(tmp_path):
    run_dir = tmp_path / "run"
    proc = start(train_args(run_dir, 10**9, "--set", "checkpoint_every=1"), tmp_path)
    manager = CheckpointManager(run_dir / "checkpoints")
    try:
        wait_for(lambda: manager.latest() is not None, proc, "the first checkpoint")
        (run_dir / LOCK_FILE).unlink()  # what a "stale lock" cleanup does
        # The resume's early probe and the lock its session takes are both refused, and
        # name the live trainer although its PID file is gone.
        with pytest.raises(RunDirError, match=f"PID {proc.pid} "):
            resume(run_dir, total_env_steps=1)  # bounded where it is let in
        with pytest.raises(RunDirError, match=f"PID {proc.pid} "):
            RunLock(run_dir).acquire()
        _stop(proc)
    finally:
        _kill_all([proc])
    steps = [r["step"] for r in rows(run_dir) if "losses/policy" in r]
    assert steps == sorted(set(steps))  # one writer: no interleaved rows
