"""SAC with gSDE climbs MountainCarContinuous-v0 within rl-zoo's budget (heavy).

The reward is sparse (+100 at the flag, minus the squared action): with independent
per-step noise SAC settles at 0 (never moving), so this run pins the gSDE exploration
and the preset translated from rl-zoo (50k env steps; rl-zoo's score 94.7). Trained
through the public API; the best policy is evaluated afresh on 20 deterministic episodes
with seeds the training never saw.
"""

from __future__ import annotations

import pytest

from rlloop.config.loading import build_config
from rlloop.runs.saved import evaluate_run
from rlloop.runs.start import train


@pytest.mark.slow
@pytest.mark.heavy
def test_sac_gsde_solves_mountaincar_continuous_within_zoo_budget(tmp_path):
    config = build_config("sac", "MountainCarContinuous-v0", flags={"seed": 0},
                          sets=["mlflow=false", "progress=false", "save_video=false"])
    assert config.total_env_steps == 50_000 and config.hparams.use_sde  # the preset
    result = train(config, tmp_path / "sac-mcc")
    ev = evaluate_run(result.run_dir, episodes=20)
    assert result.env_steps <= 50_000
    assert ev["return_mean"] >= 90, (result, ev)
