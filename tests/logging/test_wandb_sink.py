"""``--set wandb=true``: a W&B run beside MLflow, offline (no network) unless WANDB_MODE says
otherwise."""

from __future__ import annotations

import json

import pytest

from rlloop.cli.main import main

pytest.importorskip("wandb")


def test_wandb_offline_run_holds_params_and_metrics(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)  # the default must be offline
    monkeypatch.setenv("WANDB_API_KEY", "")  # and need no login
    run = tmp_path / "run"
    assert main(["train", "ppo", "--env", "CartPole-v1", "--total-env-steps", "512", "--quiet",
                 "--set", "wandb=true", "--set", "mlflow=false", "--set", "save_video=false",
                 "--set", "eval_episodes=2", "--run-dir", str(run)]) == 0
    run_id = json.loads((run / "run.json").read_text())["wandb_run_id"]
    [offline] = (run / "wandb").glob(f"offline-run-*-{run_id}")
    records = (offline / f"run-{run_id}.wandb").read_bytes()
    # The run file is W&B's own record log; the keys it holds are stored as plain text.
    for key in (b"losses/policy", b"eval/return_mean", b"env/steps_per_s", b"ppo/lr"):
        assert key in records
