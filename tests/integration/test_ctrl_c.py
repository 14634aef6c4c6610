"""Ctrl-C as a user presses it (issue 45): the console says the run was stopped and how to
resume it (MLflow's ``KILLED`` read as a crash), and a Python script gets
``KeyboardInterrupt`` once the checkpoint is written instead of going on to its next line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from proc_utils import wait_for

from rlloop import PPO, Callback, load
from rlloop.checkpoint import CheckpointManager, load_checkpoint


class _CtrlCAt(Callback):
    """Presses Ctrl-C (a real SIGINT to this process) once ``steps`` env steps are done."""

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.sent = False

    def on_step(self, stats):
        if not self.sent and stats["env/steps"] >= self.steps:
            self.sent = True
            os.kill(os.getpid(), signal.SIGINT)


def test_a_ctrl_c_stop_is_said_in_words_while_mlflow_records_killed(tmp_path, capsys):
    run = tmp_path / "run"
    model = PPO("CartPole-v1", seed=0, run_dir=run, save_video=False, stop_on_solve=False,
                num_envs=2, rollout_steps=64,
                minibatch_size=64)
    with pytest.raises(KeyboardInterrupt):
        model.learn(100_000, callbacks=[_CtrlCAt(256)])
    out = capsys.readouterr().out
    assert "KILLED" not in out
    latest = CheckpointManager(run / "checkpoints").latest()
    assert latest is not None
    assert (f"run stopped by Ctrl-C (SIGINT); checkpoint saved ({latest.name}): resume with "
            f"`rlloop train ppo --resume {run}`") in " ".join(out.split())
    assert json.loads((run / "summary.json").read_text())["stopped_by"] == "signal SIGINT"

    from mlflow.tracking import MlflowClient

    run_id = json.loads((run / "run.json").read_text())["mlflow_run_id"]
    client = MlflowClient(f"sqlite:///{run / 'mlflow.db'}")
    assert client.get_run(run_id).info.status == "KILLED"  # MLflow keeps its own word


SCRIPT = """\
from rlloop import PPO
model = PPO("CartPole-v1", seed=0, run_dir="run", save_video=False, mlflow=False,
            progress=False, stop_on_solve=False)
model.learn(1_000_000_000)
print("the next line ran", flush=True)
"""


def test_ctrl_c_in_a_python_script_raises_keyboard_interrupt_after_the_checkpoint(
        tmp_path: Path, cli_env: dict[str, str]) -> None:
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT], env=cli_env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: (run / "metrics.jsonl").is_file()
             and len((run / "metrics.jsonl").read_text().splitlines()) >= 2,
             proc, "training to log")
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert "the next line ran" not in out
    # Python's exit for an uncaught KeyboardInterrupt: it ends itself by SIGINT.
    assert proc.returncode == -signal.SIGINT, err
    assert err.rstrip().endswith("KeyboardInterrupt"), err

    latest = CheckpointManager(run / "checkpoints").latest()
    steps = load_checkpoint(latest).components["trainer"]["counters"]["env/steps"]
    assert steps > 0
    resumed = load(run, progress=False).learn(512)
    assert resumed.env_steps == steps + 512 and resumed.stopped_by == "budget"
