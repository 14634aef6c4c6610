"""A2C must learn: the shipped CartPole preset (SB3's A2C defaults, 8 envs) reaches the
env's threshold of 475 within a small budget, and its best checkpoint holds it on fresh
deterministic episodes. The preset's seeds 0-5 all solved it within 60k env steps."""

from __future__ import annotations

import pytest

from rlloop.config.loading import build_config
from rlloop.runs.saved import evaluate_run
from rlloop.runs.start import train

QUIET = ["mlflow=false", "progress=false", "save_video=false"]


@pytest.mark.slow
def test_a2c_solves_cartpole_with_its_preset(tmp_path):
    config = build_config(
        "a2c",
        "CartPole-v1",
        flags={"seed": 0},
        sets=[*QUIET, "total_env_steps=60000", "eval_every=100", "solve_episodes=20"],
    )
    result = train(config, tmp_path / "run")
    ev = evaluate_run(result.run_dir, episodes=20)
    assert result.env_steps < 60000 and ev["return_mean"] >= 475, (result, ev)
