"""The CLI as a user runs it: subprocesses, a real run directory, a real MLflow store."""

from __future__ import annotations

import importlib.util
import json
import subprocess

import pytest
from conftest import rlloop_cmd

from rlloop.checkpoint import CheckpointManager, load_checkpoint
from rlloop.cli.main import DEPRECATED_EVAL_KEYS, EVAL_KEYS


def _run(args, env, cwd, timeout=240):
    return subprocess.run(rlloop_cmd(*args), env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)


def test_train_eval_resume(tmp_path, cli_env):
    run = tmp_path / "run"
    out = _run(["train", "ppo", "--env", "CartPole-v1", "--run-dir", str(run), "--seed", "3",
                "--total-env-steps", "2048", "--set", "stop_on_solve=false",
                "--set", "checkpoint_every=2"], cli_env, tmp_path)
    assert out.returncode == 0, out.stderr
    assert "best eval return" in out.stdout and str(run) in out.stdout
    assert f"mlflow ui --backend-store-uri sqlite:///{run / 'mlflow.db'}" in out.stdout
    for name in ("config.yaml", "metrics.jsonl", "run.json", "mlflow.db", "report.md",
                 "summary.json", "report.html", "learning_curves.png"):
        assert (run / name).is_file(), name
    assert load_checkpoint(run / "best").metadata["algo"] == "ppo"
    latest = CheckpointManager(run / "checkpoints").latest()
    assert latest is not None
    assert load_checkpoint(latest).components["trainer"]["counters"]["env/steps"] == 2048
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert any("time/learn_s" in r and "env/steps_per_s" in r for r in rows)

    # The MLflow store is real and readable with MLflow's own client.
    from mlflow.tracking import MlflowClient

    run_id = json.loads((run / "run.json").read_text())["mlflow_run_id"]
    client = MlflowClient(tracking_uri=f"sqlite:///{run / 'mlflow.db'}")
    mlrun = client.get_run(run_id)
    assert mlrun.info.status == "FINISHED"
    assert mlrun.data.params["algo"] == "ppo"
    history = client.get_metric_history(run_id, "env/steps")
    assert max(m.value for m in history) == 2048

    ev = _run(["eval", str(run), "--episodes", "4", "--json"], cli_env, tmp_path)
    assert ev.returncode == 0, ev.stderr
    result = json.loads(ev.stdout.strip().splitlines()[-1])
    assert result["episodes"] == 4 and result["return_mean"] > 0 and "return_std" in result
    # One name per number: eval --json prints the keys metrics.jsonl logs under eval/.
    # ... and, for one release, the names before 0.2.0 beside them (CHANGELOG.md)
    assert set(result) == {*EVAL_KEYS, *DEPRECATED_EVAL_KEYS, "episodes"}
    assert all(result[old] == result[new] for old, new in DEPRECATED_EVAL_KEYS.items())
    logged = {key for r in rows for key in r if key.startswith("eval/")}
    assert {f"eval/{key}" for key in EVAL_KEYS} <= logged

    res = _run(["train", "ppo", "--resume", str(run), "--total-env-steps", "4096"],
               cli_env, tmp_path)
    assert res.returncode == 0, res.stderr
    latest = CheckpointManager(run / "checkpoints").latest()
    assert load_checkpoint(latest).components["trainer"]["counters"]["env/steps"] == 4096
    # the same MLflow run continues
    assert max(m.value for m in client.get_metric_history(run_id, "env/steps")) == 4096


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["train", "ppo", "--env", "CartPole-v7"], "CartPole-v1"),
        (["train", "trpo"], "choose one of"),
        (["train", "ppo", "--set", "ppo.lrr=1"], "did you mean ppo.lr"),
        (["train", "ppo", "--set", "ppo.lr=fast"], "ppo.lr must be a number"),
        (["train", "ppo", "--set", "num_envs=-2"], "num_envs must be > 0"),
        (["eval", "."], "not an rlloop run directory"),
        (["train", "ppo", "--resume", "nowhere"], "not an rlloop run directory"),
        (["train", "sac", "--env", "CartPole-v1"], "sac needs continuous (Box) actions"),
        (["train", "dqn", "--env", "Pendulum-v1"], "dqn needs discrete actions"),
        (["train", "ppo", "--env", "no_such_envs:Env-v0"], "no module named 'no_such_envs'"),
        pytest.param(["train", "ppo", "--env", "LunarLander-v3"], 'gymnasium[box2d]',
                     marks=pytest.mark.skipif(importlib.util.find_spec("Box2D") is not None,
                                              reason="Box2D is installed")),
        pytest.param(["train", "ppo", "--env", "MiniWorld-OneRoom-v0"], "pip install miniworld",
                     marks=pytest.mark.skipif(importlib.util.find_spec("miniworld") is not None,
                                              reason="miniworld is installed")),
    ],
)
def test_bad_input_gives_one_line_error(tmp_path, monkeypatch, cli_in_process, args, expected):
    monkeypatch.chdir(tmp_path)
    out = cli_in_process(args)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("rlloop: error:") and expected in lines[0], lines[0]
    assert not (tmp_path / "runs").exists()  # nothing is created for bad input


def test_resume_applies_safe_overrides_and_refuses_the_rest(tmp_path, cli_in_process):
    run = tmp_path / "run"
    quiet = ["--quiet", "--set", "mlflow=false", "--set", "save_video=false"]
    # Every CartPole episode lasts 8+ steps: solved at the first evaluation.
    out = cli_in_process(["train", "ppo", "--run-dir", str(run), "--total-env-steps", "8192",
                          "--set", "solve_threshold=5", "--set", "eval_every=1", *quiet])
    assert out.returncode == 0, out.stderr
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stopped_by"] == "solved" and summary["env_steps"] == 512

    out = cli_in_process(["train", "ppo", "--resume", str(run), "--total-env-steps", "2048",
                          "--set", "stop_on_solve=false", "--set", "eval_every=2", *quiet])
    assert out.returncode == 0, out.stderr
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stopped_by"] == "budget" and summary["env_steps"] == 2048
    saved = (run / "config.yaml").read_text()
    assert "stop_on_solve: false" in saved and "eval_every: 2" in saved

    # Settings the checkpoints depend on are refused, all named in one line, and the
    # run is left as it was.
    out = cli_in_process(["train", "ppo", "--resume", str(run), "--env", "Acrobot-v1",
                          "--set", "ppo.hidden=[8]", "--set", "total_env_steps=4096"])
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rlloop: error: a resumed run cannot change")
    assert "env" in lines[0] and "ppo.hidden" in lines[0] and "total_env_steps," not in lines[0]
    assert CheckpointManager(run / "checkpoints").latest().name == f"{2048:09d}"
    # Repeating a setting with its saved value is not a change.
    out = cli_in_process(["train", "ppo", "--resume", str(run), "--env", "CartPole-v1",
                          "--total-env-steps", "2560", *quiet])
    assert out.returncode == 0, out.stderr
    assert "progress: false" in (run / "config.yaml").read_text()
    # --quiet held for the invocations that passed it, not for every later resume.
    out = cli_in_process(["train", "ppo", "--resume", str(run), "--total-env-steps", "3072",
                          "--set", "mlflow=false", "--set", "save_video=false"])
    assert out.returncode == 0, out.stderr
    saved = (run / "config.yaml").read_text()
    assert "progress: true" in saved and "profile: null" in saved


def test_a_closed_pipe_ends_a_listing_quietly(tmp_path, cli_env):
    """`rlloop presets | head` printed "rlloop: error: BrokenPipeError ..." when head left
    before the listing ended."""
    probe = ("import sys, rlloop.cli.main as cli\n"
             "def listing(args):\n"
             "    raise BrokenPipeError(32, 'Broken pipe')\n"
             "cli._presets = listing\n"
             "sys.exit(cli.main(['presets']))\n")
    proc = subprocess.Popen([*rlloop_cmd()[:1], "-c", probe], env=cli_env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone, as `head` is once it has its lines
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 1 and err == "", err
    # Any other BrokenPipeError (a callback's closed socket) is a failure to report.
    done = subprocess.run([*rlloop_cmd()[:1], "-c", probe], env=cli_env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr.startswith("rlloop: error: BrokenPipeError: [Errno 32] Broken pipe")
