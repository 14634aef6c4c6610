"""``rlloop train ppo --env MiniGrid-DoorKey-5x5-v0`` works as typed (the mission text is
left out) and reaches rl-zoo's score within its 100k steps (issue 45, item 8; zoo 0.964).

The run trains with nothing but the preset (and a solve threshold a little above the bar);
the best policy is then evaluated afresh on 20 deterministic episodes.
"""

from __future__ import annotations

import pytest

from rlloop.config.loading import build_config
from rlloop.runs.saved import evaluate_run
from rlloop.runs.start import train

pytest.importorskip("minigrid", reason="needs minigrid: pip install minigrid")


@pytest.mark.slow
@pytest.mark.heavy
def test_ppo_opens_the_door_within_rl_zoos_budget(tmp_path):
    config = build_config("ppo", "MiniGrid-DoorKey-5x5-v0", flags={"seed": 0},
                          sets=["mlflow=false", "progress=false", "save_video=false",
                                "solve_threshold=0.93"])
    assert config.total_env_steps <= 100_000  # rl-zoo's budget
    result = train(config, tmp_path / "run")
    ev = evaluate_run(result.run_dir, episodes=20)
    assert result.env_steps <= 100_000
    assert ev["return_mean"] >= 0.9, (result, ev)
