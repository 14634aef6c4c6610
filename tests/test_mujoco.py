"""MuJoCo (Gymnasium v5) presets from rl-zoo, and PPO solving InvertedPendulum-v5."""

from __future__ import annotations

import pytest

from rlloop.config import build_config
from rlloop.presets import preset
from rlloop.run import train

ENVS = ["HalfCheetah-v5", "Hopper-v5", "Walker2d-v5", "Ant-v5", "Humanoid-v5",
        "InvertedPendulum-v5"]
QUIET = ["mlflow=false", "progress=false", "save_video=false"]


@pytest.mark.parametrize("env", ENVS)
@pytest.mark.parametrize("algo", ["ppo", "sac", "td3"])
def test_every_mujoco_env_has_a_valid_zoo_preset(env, algo):
    layer = preset(algo, env)
    assert layer, f"no {algo} preset for {env}"
    config = build_config(algo, env, sets=QUIET)
    if algo == "ppo":  # rl-zoo's `normalize: true` (VecNormalize), saved in checkpoints
        assert config.hparams.normalize_obs and config.hparams.normalize_rewards
    else:
        assert config.hparams.learning_starts == 10_000


def test_hopper_ppo_preset_carries_the_zoo_numbers():
    ppo = build_config("ppo", "Hopper-v5", sets=QUIET).hparams
    assert (ppo.rollout_steps, ppo.minibatch_size, ppo.num_epochs) == (512, 32, 5)
    assert (ppo.gamma, ppo.gae_lambda, ppo.lr) == (0.999, 0.99, 9.80828e-05)
    assert (ppo.hidden, ppo.activation, ppo.init_log_std) == ([256, 256], "relu", -2.0)


@pytest.mark.heavy
@pytest.mark.slow
def test_ppo_solves_inverted_pendulum_v5_with_its_preset(tmp_path):
    # Solved means a 100-episode evaluation at the maximum return, 1000.
    result = train(build_config("ppo", "InvertedPendulum-v5", flags={"total_env_steps": 200_000},
                                sets=[*QUIET, "solve_threshold=1000"]), tmp_path / "run")
    assert result.stopped_by == "solved", result
    assert result.best_eval_return == 1000.0
