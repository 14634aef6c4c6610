"""A tracking store that hangs or refuses connections never holds training up.

Real `rlloop train` processes log to a real MLflow HTTP URI on loopback: a socket server
that accepts connections and never answers, or a port where nothing listens. Training
goes on, SIGTERM is honoured within seconds, and the exit waits a bounded time and says
in one line how many metric rows MLflow did not get (metrics.jsonl has them all).
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import rlloop_cmd

CLOSE_TIMEOUT_S = 2.0
# From the final checkpoint to exit: the close timeout, plus the sink child's start (Python,
# `import mlflow`: seconds on a loaded CI machine, and it is waited for while it works).
# MLflow's own retries on an unreachable store take ~60 s; a hung server, forever.
EXIT_BOUND_S = 30.0
# Tiny PPO iterations: hundreds of metric rows within seconds, far more than a pipe holds.
FAST = ["--set", "num_envs=2", "--set", "ppo.rollout_steps=8", "--set", "ppo.minibatch_size=16",
        "--set", "ppo.num_epochs=1", "--set", "eval_every=0", "--set", "checkpoint_every=0",
        "--set", "stop_on_solve=false", "--set", "save_video=false", "--quiet",
        "--set", f"mlflow_close_timeout_s={CLOSE_TIMEOUT_S}"]


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A loopback port that accepts connections and never answers on them."""
    server = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []

    def accept() -> None:
        try:
            while True:
                accepted.append(server.accept()[0])
        except OSError:  # closed by the fixture
            pass

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    server.close()
    for conn in accepted:
        conn.close()
    thread.join(5)


@pytest.fixture
def refusing_port() -> int:
    """A loopback port where nothing listens: connections are refused at once."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def metric_rows(run: Path) -> int:
    path = run / "metrics.jsonl"
    if not path.exists():
        return 0
    return sum(1 for line in path.read_text().splitlines() if line.endswith("}"))


def wait_rows(proc: subprocess.Popen[str], run: Path, count: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while metric_rows(run) < count:
        if proc.poll() is not None:
            pytest.fail(f"training exited early ({proc.returncode}):\n{proc.communicate()}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"training stalled at {metric_rows(run)} metric rows (MLflow blocked it?)")
        time.sleep(0.05)


def warnings_about_mlflow(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "MLflow" in line]


def finish_and_time(proc: subprocess.Popen[str], run: Path) -> tuple[str, str, float]:
    """Wait for exit; seconds from the final checkpoint (written just before the sinks
    close) to the process's exit."""
    out, err = proc.communicate(timeout=240)
    exited = time.time()
    final = max((run / "checkpoints").iterdir(), key=lambda p: p.stat().st_mtime)
    return out, err, exited - final.stat().st_mtime


def test_a_hung_tracking_server_neither_blocks_training_nor_sigterm(tmp_path, cli_env,
                                                                    silent_server):
    run = tmp_path / "run"
    proc = subprocess.Popen(
        rlloop_cmd("train", "ppo", "--run-dir", str(run), "--total-env-steps", "1000000000",
                   "--set", f"mlflow_tracking_uri=http://127.0.0.1:{silent_server}", *FAST),
        env=cli_env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # The sink child is stuck on the server from the start; training goes on regardless.
    wait_rows(proc, run, 100)
    proc.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    out, err, exit_after_save = finish_and_time(proc, run)
    assert proc.returncode == 0, err
    assert "signal SIGTERM" in out
    assert time.monotonic() - sent < EXIT_BOUND_S
    assert exit_after_save < EXIT_BOUND_S
    [warning] = warnings_about_mlflow(err)
    assert f"http://127.0.0.1:{silent_server}" in warning
    assert "metric rows were not logged" in warning
    rows = metric_rows(run)
    assert f"of {rows} metric rows" in warning
    assert "mlflow ui" not in out  # the summary names no store that holds nothing
    assert json.loads((run / "run.json").read_text())["mlflow_run_id"] is None


def test_a_refused_tracking_uri_costs_a_bounded_wait_and_one_warning(tmp_path, cli_env,
                                                                     refusing_port):
    run = tmp_path / "run"
    proc = subprocess.Popen(
        rlloop_cmd("train", "ppo", "--run-dir", str(run), "--total-env-steps", "2048",
                   "--set", f"mlflow_tracking_uri=http://127.0.0.1:{refusing_port}", *FAST),
        env=cli_env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err, exit_after_save = finish_and_time(proc, run)
    assert proc.returncode == 0, err
    assert exit_after_save < EXIT_BOUND_S
    [warning] = warnings_about_mlflow(err)
    assert f"{metric_rows(run)} of {metric_rows(run)} metric rows were not logged" in warning
    assert "mlflow ui" not in out
