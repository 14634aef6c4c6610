"""Memory must matter: on masked-velocity CartPole (position and angle only) recurrent PPO
solves the task, and feed-forward PPO does not within the same budget.

Both train through the public API with the CartPole-v1 preset; the best policy is loaded
from its checkpoint and evaluated afresh on 20 deterministic episodes, as ``rlloop eval``
does (the recurrent state carried through each episode and reset between them).
"""

from __future__ import annotations

import pytest

from rlloop.config.loading import build_config
from rlloop.runs.saved import evaluate_run
from rlloop.runs.start import train

QUIET = ["mlflow=false", "progress=false", "save_video=false"]
BUDGET = 100_000
MASKED = ["env.mask_velocity=true", f"total_env_steps={BUDGET}"]


def _train_and_eval(path, seed, sets):
    config = build_config("ppo", "CartPole-v1", flags={"seed": seed},
                          sets=[*QUIET, *MASKED, *sets])
    result = train(config, path)
    return result, evaluate_run(result.run_dir, episodes=20)


@pytest.mark.slow
@pytest.mark.heavy
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_recurrent_ppo_solves_masked_cartpole_and_feed_forward_does_not(tmp_path, seed):
    result, ev = _train_and_eval(tmp_path / "gru", seed, ["ppo.recurrent=gru"])
    assert result.stopped_by == "solved", (result.stopped_by, result.best_eval_return)
    assert result.env_steps < BUDGET
    assert ev["return_mean"] >= 475, ev

    ff, ff_ev = _train_and_eval(tmp_path / "ff", seed, [])
    assert ff.stopped_by == "budget" and ff.env_steps >= BUDGET
    assert ff.best_eval_return is not None and ff.best_eval_return < 475
    assert ff_ev["return_mean"] < 475, ff_ev
