"""``--backend gymnasium-async`` under real faults, through the CLI as a user runs it.

The env (``async_fault_envs:Fault-v0``, no ``unwrapped.state``) raises, segfaults or
hangs in ``step()`` once, in the second iteration. Each run must end within a bounded
time with one line naming the env and the worker (exit 2), leave the checkpoint of the
last completed iteration, resume from it, and leave no process behind: every process
that held an env (each writes its pid) and every descendant seen while the trainer ran
is gone afterwards. A stop signal must end a run whose worker hangs within seconds; an
env that hangs in-process needs a second signal.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
from conftest import rlloop_cmd
from proc_utils import still_alive

from rlloop.checkpoint import CheckpointManager, load_checkpoint

ENV = "async_fault_envs:Fault-v0"
TESTS = Path(__file__).resolve().parents[1]
SMALL = ["--num-envs", "2", "--quiet", "--set", "ppo.rollout_steps=32",
         "--set", "ppo.minibatch_size=32", "--set", "checkpoint_every=1",
         "--set", "keep_checkpoints=10", "--set", "eval_every=2", "--set", "eval_episodes=2",
         "--set", "mlflow=false", "--set", "save_video=false"]
ITERATION = 64  # env steps per iteration: 32 steps x 2 envs; the fault fires in the second


class Trainer:
    """One ``rlloop train`` process, watched: its descendants, and when the fault fired."""

    def __init__(self, tmp_path: Path, cli_env: dict[str, str], fault: str | None,
                 *args: str, backend: str = "gymnasium-async") -> None:
        self.run, self.tokens, self.pids = (tmp_path / "run", tmp_path / "tokens",
                                            tmp_path / "pids")
        self.tokens.mkdir()
        if fault:
            (self.tokens / "0.token").touch()
        kwargs = {"fault": fault, "token_dir": str(self.tokens), "fault_after": 40,
                  "pid_dir": str(self.pids)}
        env = {**cli_env, "PYTHONPATH": f"{TESTS}{os.pathsep}{cli_env['PYTHONPATH']}"}
        self.env, self.cwd = env, tmp_path
        self.proc = subprocess.Popen(
            rlloop_cmd("train", "ppo", "--env", ENV, "--backend", backend, "--run-dir",
                       str(self.run), *SMALL, "--set", f"env_kwargs={json.dumps(kwargs)}", *args),
            env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.seen: set[int] = set()
        self.fired_at: float | None = None

    def watch(self, until: float | None = None, timeout: float = 120.0) -> bool:
        """Poll until the trainer exits (True) or ``until`` seconds after the fault (False)."""
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None:
            self.seen |= descendants(self.proc.pid)
            if self.fired_at is None and not any(self.tokens.glob("*.token")):
                self.fired_at = time.monotonic()
            if until is not None and self.fired_at and time.monotonic() > self.fired_at + until:
                return False
            if time.monotonic() > deadline:
                self.proc.kill()
                pytest.fail(f"the trainer did not exit within {timeout} s")
            time.sleep(0.05)
        return True

    def finish(self, timeout: float = 120.0) -> tuple[str, str]:
        self.watch(timeout=timeout)
        out, err = self.proc.communicate()
        return out, err

    def assert_no_process_left(self) -> None:
        env_pids = {int(p.name) for p in self.pids.iterdir()} - {self.proc.pid}
        assert len(env_pids) >= 2, "no env worker process was started"
        # Gone, not reparented: the trainer, its forkserver and every env worker.
        assert still_alive(env_pids | self.seen, timeout=10.0) == []

    def resume(self, total_env_steps: int) -> None:
        done = subprocess.run(rlloop_cmd("train", "ppo", "--resume", str(self.run), "--quiet",
                                         "--total-env-steps", str(total_env_steps)),
                              env=self.env, cwd=self.cwd, capture_output=True, text=True,
                              timeout=240)
        assert done.returncode == 0, done.stderr
        assert latest_steps(self.run) == total_env_steps


def descendants(pid: int) -> set[int]:
    try:
        return {p.pid for p in psutil.Process(pid).children(recursive=True)}
    except psutil.NoSuchProcess:
        return set()


def latest_steps(run: Path) -> int:
    latest = CheckpointManager(run / "checkpoints").latest()
    assert latest is not None, "no checkpoint"
    steps: int = load_checkpoint(latest).components["trainer"]["counters"]["env/steps"]
    return steps


def test_env_without_physics_state_reaches_its_checkpoints(tmp_path, cli_env):
    trainer = Trainer(tmp_path, cli_env, None, "--total-env-steps", str(4 * ITERATION))
    out, err = trainer.finish()
    assert trainer.proc.returncode == 0, err
    assert "stopped by: budget" in out
    saved = CheckpointManager(trainer.run / "checkpoints").all()
    assert [int(p.name) for p in saved] == [ITERATION * k for k in (1, 2, 3, 4)]
    env_state = load_checkpoint(saved[-1]).components["algorithm"]["runner"]["env"]
    assert "env_rngs" in env_state and "physics" not in env_state
    trainer.assert_no_process_left()


@pytest.mark.parametrize(("fault", "says"), [
    ("raise", "raised in step(): RuntimeError: injected fault: the env raised"),
    ("segfault", "was killed by SIGSEGV in step()"),
    ("hang", "did not answer step() within step_timeout=2.0 s"),
])
def test_a_failing_worker_ends_the_run_with_a_checkpoint_and_no_orphans(
        tmp_path, cli_env, fault, says):
    trainer = Trainer(tmp_path, cli_env, fault, "--total-env-steps", "100000",
                      "--set", "step_timeout=2")
    _, err = trainer.finish()
    assert trainer.proc.returncode == 2, err
    assert trainer.fired_at is not None and time.monotonic() - trainer.fired_at < 20
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"rlloop: error: gymnasium-async env '{ENV}': worker ") and says in last
    # The final checkpoint holds the last completed iteration; the env's RNG died with it.
    assert latest_steps(trainer.run) == ITERATION
    trainer.assert_no_process_left()
    trainer.resume(3 * ITERATION)  # the fault fired once: the resumed run trains on


def test_sigterm_stops_a_run_whose_worker_hangs_within_seconds(tmp_path, cli_env):
    trainer = Trainer(tmp_path, cli_env, "hang", "--total-env-steps", "100000")
    assert not trainer.watch(until=0.5)  # step_timeout stays at 60 s: only the signal helps
    trainer.proc.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    out, err = trainer.finish()
    assert trainer.proc.returncode == 0, err
    assert time.monotonic() - sent < 15
    assert "stopped by: signal SIGTERM" in out
    assert latest_steps(trainer.run) == ITERATION
    trainer.assert_no_process_left()
    trainer.resume(3 * ITERATION)


def test_no_worker_outlives_a_sigkilled_trainer(tmp_path, cli_env):
    trainer = Trainer(tmp_path, cli_env, "hang", "--total-env-steps", "100000")
    assert not trainer.watch(until=0.5)
    trainer.proc.kill()
    trainer.finish()
    trainer.assert_no_process_left()


def test_a_second_sigterm_ends_an_in_process_hang(tmp_path, cli_env):
    """The in-process backend cannot time a step out: the first SIGTERM waits for an
    iteration boundary that never comes; the second one exits at once (code 130)."""
    trainer = Trainer(tmp_path, cli_env, "hang", "--total-env-steps", "100000",
                      backend="gymnasium")
    assert not trainer.watch(until=0.5)
    trainer.proc.send_signal(signal.SIGTERM)
    assert not trainer.watch(until=2.5)
    trainer.proc.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    _, err = trainer.finish()
    assert trainer.proc.returncode == 130, err
    assert time.monotonic() - sent < 15
    assert err.strip().splitlines()[-1] == "rlloop: interrupted"
    assert latest_steps(trainer.run) == ITERATION
