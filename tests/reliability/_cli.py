"""Real ``rlloop`` processes on real run directories, for the run-directory tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
# Small PPO iterations (512 env steps), no MLflow, no video: a run logs within seconds.
FAST = ["--quiet", "--set", "stop_on_solve=false", "--set", "mlflow=false",
        "--set", "save_video=false", "--set", "eval_episodes=2"]


def cli_environ() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(SRC) + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def rlloop(*args: str) -> list[str]:
    return [sys.executable, "-m", "rlloop", *args]


def run(args: Sequence[str], cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(rlloop(*args), env=cli_environ(), cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)


def start(args: Sequence[str], cwd: Path) -> subprocess.Popen[str]:
    """A background ``rlloop`` in its own session, so a SIGKILL reaches all its processes."""
    return subprocess.Popen(rlloop(*args), env=cli_environ(), cwd=cwd, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)


def train_args(run_dir: Path, steps: int = 10**9, *extra: str) -> list[str]:
    return ["train", "ppo", "--env", "CartPole-v1", "--run-dir", str(run_dir),
            "--total-env-steps", str(steps), *FAST, *extra]


def rows(run_dir: Path) -> list[dict[str, float]]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]




def one_error_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]
