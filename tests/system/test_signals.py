"""Real signals to real training processes, as an operator or a scheduler sends them.

``SIGUSR1`` writes a checkpoint and training goes on; ``SIGTERM``/``SIGINT`` stop cleanly
with a final checkpoint, and a resume continues from that step. Checked for
``rlloop train`` and for the task trainer (the REINFORCE example, with process workers),
whose worker processes must all be gone afterwards, even when the trainer is SIGKILLed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import gymnasium
import psutil
import pytest
import torch
from conftest import rlloop_cmd
from proc_utils import still_alive, wait_for

from rlloop.checkpoint import CheckpointManager, load_checkpoint, verify_checkpoint
from rlloop.envs.registry import make_env
from rlloop.errors import EnvError
from rlloop.runners.evaluation import evaluate
from rlloop.system import signals
from rlloop.system.signals import (
    atomic,
    handle_signals,
    interrupted,
    supervised,
    terminate_as_interrupt,
)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "reinforce_cartpole.py"
TESTS = Path(__file__).resolve().parents[1]




def rows(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def checkpoints(run: Path) -> list[Path]:
    return CheckpointManager(run / "checkpoints").all()


def descendants(pid: int) -> set[int]:
    try:
        return {p.pid for p in psutil.Process(pid).children(recursive=True)}
    except psutil.NoSuchProcess:
        return set()


def usr1_then_term(proc: subprocess.Popen, run: Path) -> tuple[str, str]:
    """SIGUSR1 -> a checkpoint appears while training goes on; SIGTERM -> clean exit 0."""
    wait_for(lambda: len(rows(run)) >= 2, proc, "training to log")
    assert checkpoints(run) == []  # no periodic ones in these runs
    proc.send_signal(signal.SIGUSR1)
    wait_for(lambda: len(checkpoints(run)) == 1, proc, "the SIGUSR1 checkpoint")
    logged = len(rows(run))
    wait_for(lambda: len(rows(run)) > logged + 1, proc, "training to go on after SIGUSR1")
    proc.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    # Stops at the next iteration boundary and writes one checkpoint: seconds, not minutes
    # (the bound leaves room for a loaded CI machine).
    assert time.monotonic() - sent < 15
    return out, err


def test_rlloop_train_signals_and_resume(tmp_path, cli_env):
    run = tmp_path / "run"
    proc = subprocess.Popen(
        rlloop_cmd("train", "ppo", "--env", "CartPole-v1", "--run-dir", str(run), "--quiet",
                   "--total-env-steps", "1000000000", "--set", "stop_on_solve=false",
                   "--set", "checkpoint_every=0", "--set", "eval_every=0",
                   "--set", "mlflow=false", "--set", "save_video=false"),
        env=cli_env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, _ = usr1_then_term(proc, run)
    assert "signal SIGTERM" in out
    final = load_checkpoint(CheckpointManager(run / "checkpoints").latest())
    steps = final.components["trainer"]["counters"]["env/steps"]
    assert steps == max(r["step"] for r in rows(run))  # saved where it stopped

    done = subprocess.run(rlloop_cmd("train", "ppo", "--resume", str(run), "--total-env-steps",
                                     str(steps + 2048)),
                          env=cli_env, cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    resumed = load_checkpoint(CheckpointManager(run / "checkpoints").latest())
    assert resumed.components["trainer"]["counters"]["env/steps"] == steps + 2048
    later = [r["env/steps"] for r in rows(run) if "losses/policy" in r and r["env/steps"] > steps]
    assert later[0] == steps + 512  # the first iteration after the resume, not a restart


def example_cmd(run: Path, *args: str) -> list[str]:
    return [sys.executable, str(EXAMPLE), "--run-dir", str(run), "--mode", "process",
            "--workers", "2", "--epoch-samples", "256", "--solve-at", "1e9", "--quiet", *args]


def test_task_trainer_signals_resume_and_no_orphans(tmp_path, cli_env):
    run = tmp_path / "run"
    proc = subprocess.Popen(example_cmd(run, "--total-steps", "100000"), env=cli_env,
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    wait_for(lambda: len(rows(run)) >= 1, proc, "the first epoch")
    workers = descendants(proc.pid)
    assert len(workers) >= 2
    out, _ = usr1_then_term(proc, run)
    assert json.loads(out.strip().splitlines()[-1])["stopped_by"] == "SIGTERM"
    assert still_alive(workers) == []  # workers, forkserver, everything
    final = load_checkpoint(CheckpointManager(run / "checkpoints").latest())
    steps = final.components["trainer"]["counters"]["train/steps"]
    assert steps >= max(r["train/steps"] for r in rows(run))

    done = subprocess.run(example_cmd(run, "--resume", "--total-steps", str(steps + 2),
                                      "--eval-episodes", "1"),
                          env=cli_env, cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1])["train_steps"] == steps + 2
    assert checkpoints(run)[-1].name == f"{steps + 2:09d}"
    assert [r["train/steps"] for r in rows(run)][-2:] == [steps + 1, steps + 2]


@pytest.mark.parametrize("how", ["SIGINT", "SIGKILL"])
def test_no_worker_outlives_an_interrupted_or_killed_trainer(tmp_path, cli_env, how):
    run = tmp_path / "run"
    proc = subprocess.Popen(example_cmd(run, "--total-steps", "100000"), env=cli_env,
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    wait_for(lambda: len(rows(run)) >= 1, proc, "the first epoch")
    workers = descendants(proc.pid)
    assert len(workers) >= 2
    if how == "SIGINT":  # Ctrl-C reaches the whole foreground process group
        os.killpg(proc.pid, signal.SIGINT)
        proc.communicate(timeout=120)
        assert proc.returncode == 0 and checkpoints(run)
    else:
        proc.kill()
        proc.communicate(timeout=60)
    assert still_alive(workers, timeout=10.0) == []


class SwigLikeInterrupt(gymnasium.Wrapper):
    """Gets two stop signals inside ``step()`` and turns the ``KeyboardInterrupt`` of the
    second into a TypeError, as Box2D's SWIG layer does when it strikes in a contact
    callback; with ``signals=False`` it just raises the TypeError (a real env bug)."""

    def __init__(self, env: gymnasium.Env, signals: bool) -> None:
        super().__init__(env)
        self.signals = signals

    def step(self, action):
        try:
            if self.signals:
                os.kill(os.getpid(), signal.SIGTERM)  # the first asks for a clean stop
                os.kill(os.getpid(), signal.SIGTERM)  # the second interrupts at once
            raise TypeError("in method 'b2World_Step', argument 2 of type 'float32'")
        except KeyboardInterrupt:
            raise TypeError("a KeyboardInterrupt from a Python callback") from None


gymnasium.register("SwigLikeCartPole-v0", disable_env_checker=True,
                   entry_point=lambda signals: SwigLikeInterrupt(gymnasium.make("CartPole-v1"),
                                                                  signals))


@pytest.mark.parametrize("signals", [True, False])
def test_a_second_stop_signal_inside_an_env_is_not_blamed_on_the_env(signals):
    target = SimpleNamespace(stop_requested=None, save_requested=False)
    env = make_env("SwigLikeCartPole-v0", 1, backend="gymnasium", seed=0,
                   env_kwargs={"signals": signals})
    env.reset()
    with handle_signals(target):
        if signals:
            with pytest.raises(KeyboardInterrupt):
                env.step(torch.zeros(1, dtype=torch.int64))
            assert target.stop_requested == "SIGTERM"
        else:
            with pytest.raises(EnvError, match=r"raised TypeError in step\(\).*fix the env"):
                env.step(torch.zeros(1, dtype=torch.int64))
    assert not interrupted()  # the block's end forgets it
    env.close()


def _stop_target() -> SimpleNamespace:
    return SimpleNamespace(stop_requested=None, save_requested=False)


def test_a_second_stop_signal_waits_for_the_update_to_end():
    """It used to cut the update short, so the final checkpoint held a half-applied update
    with counters that had already counted it."""
    target, done = _stop_target(), []
    with pytest.raises(KeyboardInterrupt), handle_signals(target):
        os.kill(os.getpid(), signal.SIGTERM)  # the first: stop at the next boundary
        assert target.stop_requested == "SIGTERM"
        with atomic():
            os.kill(os.getpid(), signal.SIGTERM)  # the second, mid-update
            done.append("update")
        done.append("next iteration")
    assert done == ["update"]


@pytest.mark.parametrize("stopped_first", [True, False])
def test_a_stop_signal_during_the_final_checkpoint_waits_for_it(stopped_first):
    """It used to get the default action there (the process died with no checkpoint)."""
    target, written = _stop_target(), []
    before = signal.getsignal(signal.SIGTERM)

    def finish(status: str) -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        written.append(status)

    with pytest.raises(KeyboardInterrupt), supervised(target, finish):
        if stopped_first:
            os.kill(os.getpid(), signal.SIGTERM)
    assert written == ["KILLED" if stopped_first else "FINISHED"]
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.parametrize("first", ["SIGTERM", "SIGINT"])
def test_a_second_stop_signal_another_thread_takes_interrupts_a_blocking_sleep(first):
    """Linux gives a process's signal to another thread when the main thread already has one
    pending (two sent together). Python's handler runs in the main thread only, so the
    interrupt waited until the main thread's blocking call (an env's time.sleep in step)
    returned: forever for an env that hangs. Here a helper thread takes both signals."""
    target = _stop_target()

    def send_to_this_thread() -> None:
        for sig in (getattr(signal, first), signal.SIGTERM):
            time.sleep(0.5)
            signal.pthread_kill(threading.get_ident(), sig)

    sender = threading.Thread(target=send_to_this_thread)
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt), handle_signals(target):
        sender.start()
        time.sleep(10)
    assert time.monotonic() - started < 5
    assert target.stop_requested == first
    sender.join()


@pytest.mark.parametrize("first,backend", [("SIGTERM", "gymnasium"), ("SIGINT", "gymnasium"),
                                           ("SIGTERM", "gymnasium-thread")])
def test_two_stop_signals_end_a_run_whose_env_hangs_in_step(tmp_path, cli_env, first, backend):
    """An env that sleeps forever in ``step()`` never reaches the boundary where the first
    signal takes effect; the second, a second later, ends the run within seconds with exit
    130 and the last checkpoint intact. The run hung until a third signal killed it: where
    the kernel gave the signals to another thread (as it does with two sent together; the
    env here has it do so), and with gymnasium-thread, whose closing (and the interpreter's
    exit) waited for the hung step's thread."""
    env = {**cli_env, "PYTHONPATH": f"{TESTS}{os.pathsep}{cli_env['PYTHONPATH']}"}
    run, flag, num_envs = tmp_path / "run", tmp_path / "hanging", 2
    other_thread = str(backend == "gymnasium").lower()  # the step runs in the main thread
    proc = subprocess.Popen(
        rlloop_cmd("train", "ppo", "--env", "hanging_env:HangingCartPole-v0", "--backend",
                   backend, "--num-envs", str(num_envs), "--run-dir", str(run), "--quiet",
                   "--total-env-steps", "100000", "--set", "ppo.rollout_steps=64",
                   "--set", "ppo.minibatch_size=32", "--set", "checkpoint_every=1",
                   "--set", "eval_every=0", "--set", "mlflow=false",
                   "--set", "save_video=false", "--set", "env_kwargs.after=300",
                   "--set", f"env_kwargs.flag={flag}",
                   "--set", f"env_kwargs.other_thread={other_thread}"),
        env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)
    try:
        wait_for(flag.exists, proc, "the env to hang")
        proc.send_signal(getattr(signal, first))
        time.sleep(1)
        proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 130, err
    assert time.monotonic() - sent < 10
    assert err.strip().splitlines()[-1] == "rlloop: interrupted", err
    latest = CheckpointManager(run / "checkpoints").latest()
    assert latest is not None and int(latest.name) == 4 * 64 * num_envs  # 4 whole iterations
    verify_checkpoint(latest)


def test_sigterm_after_training_interrupts_like_ctrl_c():
    """After the loop (video, report) SIGTERM had its default action: the MLflow run was
    never closed."""
    with pytest.raises(KeyboardInterrupt), terminate_as_interrupt():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)


def test_sigusr1_outside_the_training_loop_does_not_kill_the_run(tmp_path, cli_env):
    """SIGUSR1's default action killed the process outside the loop (start-up, the
    end-of-run report): no report.md, exit -10. The loop's handler saves; outside it the
    signal is ignored."""
    run = tmp_path / "run"
    proc = subprocess.Popen(
        rlloop_cmd("train", "ppo", "--env", "CartPole-v1", "--run-dir", str(run), "--quiet",
                   "--total-env-steps", "2048", "--set", "stop_on_solve=false",
                   "--set", "mlflow=false", "--set", "save_video=false"),
        env=cli_env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: (run / "checkpoints" / "000002048").is_dir(), proc, "the final checkpoint")
    while proc.poll() is None:  # through the report, to the exit
        proc.send_signal(signal.SIGUSR1)
        time.sleep(0.02)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert (run / "report.md").is_file() and (run / "summary.json").is_file()


def test_an_evaluation_gives_up_its_grace_period_after_a_stop_signal(monkeypatch):
    """A first stop signal let an evaluation run to its end: 1,000 slow episodes (Atari's
    whole games, a 100-episode solve confirmation) outlasted a scheduler's grace period.
    It now gives up EVAL_STOP_GRACE_S after the signal (the run's checkpoint owes it)."""
    monkeypatch.setattr(signals, "EVAL_STOP_GRACE_S", 0.3)
    env = make_env("CartPole-v1", 2, backend="native", seed=0)

    def slow_act(obs):
        time.sleep(0.01)
        return torch.zeros(len(obs), dtype=torch.int64)

    assert evaluate(slow_act, env, 2, seed=0)["episodes"] == 2.0  # no stop: to its end
    with handle_signals(_stop_target()):
        os.kill(os.getpid(), signal.SIGTERM)
        started = time.monotonic()
        with pytest.raises(signals.StopInterrupted, match=r"evaluation left after \d+ of 1000"):
            evaluate(slow_act, env, 1000, seed=0)
    assert time.monotonic() - started < 2.0
