"""The shipped presets learn what rl-zoo's do, within rl-zoo's budgets (heavy: minutes each).

Each run trains through the public API with nothing but the preset (and a solve threshold
a little above the test's bar, so a run that stops early stops on a policy that clears
it), then the best policy is loaded from its checkpoint and evaluated afresh on 20
deterministic episodes with seeds the training never saw.
"""

from __future__ import annotations

import pytest

from rlloop.config.loading import build_config
from rlloop.runs.saved import evaluate_run
from rlloop.runs.start import train

QUIET = ["mlflow=false", "progress=false", "save_video=false"]


def _train_and_eval(tmp_path, algo, env, sets=()):
    config = build_config(algo, env, flags={"seed": 0}, sets=[*QUIET, *sets])
    budget = config.total_env_steps
    result = train(config, tmp_path / f"{algo}-{env}")
    return budget, result, evaluate_run(result.run_dir, episodes=20)


@pytest.mark.slow
@pytest.mark.heavy
def test_ppo_lands_lunarlander_within_rl_zoos_budget(tmp_path):
    pytest.importorskip("Box2D", reason="needs gymnasium[box2d]: pip install rlloop[box2d]")
    budget, result, ev = _train_and_eval(tmp_path, "ppo", "LunarLander-v3",
                                         ["solve_threshold=230"])
    assert budget == 1_000_000  # rl-zoo's
    assert result.env_steps <= budget
    assert ev["return_mean"] >= 200, (result, ev)


@pytest.mark.slow
@pytest.mark.heavy
def test_dqn_swings_up_acrobot_within_rl_zoos_budget(tmp_path):
    budget, result, ev = _train_and_eval(tmp_path, "dqn", "Acrobot-v1",
                                         ["solve_threshold=-85"])
    assert budget == 100_000  # rl-zoo's
    assert result.env_steps <= budget
    assert ev["return_mean"] >= -100, (result, ev)
