"""MuJoCo (Gymnasium v5) presets from rl-zoo, and PPO solving InvertedPendulum-v5."""

from __future__ import annotations

import pytest

from rlloop.config.loading import build_config
from rlloop.config.presets import all_files, preset
from rlloop.runs.start import train

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
    # rl-zoo's vf_coef 0.835671 in SB3's loss, whose value term has no factor 1/2, and its
    # policy_kwargs' ortho_init=False
    assert ppo.vf_coef == 2 * 0.835671
    assert ppo.ortho_init is False


#: rl-zoo's PPO vf_coef for each MuJoCo env (SB3's convention; Ant: SB3's default).
ZOO_VF_COEF = {"HalfCheetah-v5": 0.58096, "Hopper-v5": 0.835671, "Walker2d-v5": 0.871923,
               "Ant-v5": 0.5, "Humanoid-v5": 0.431892, "InvertedPendulum-v5": 0.19816}


@pytest.mark.parametrize("env", ENVS)
def test_mujoco_ppo_presets_double_sb3s_vf_coef(env):
    assert build_config("ppo", env, sets=QUIET).hparams.vf_coef == 2 * ZOO_VF_COEF[env]


@pytest.mark.heavy
@pytest.mark.slow
def test_ppo_solves_inverted_pendulum_v5_with_its_preset(tmp_path):
    # Solved means a 100-episode evaluation at the maximum return, 1000.
    result = train(build_config("ppo", "InvertedPendulum-v5", flags={"total_env_steps": 200_000},
                                sets=[*QUIET, "solve_threshold=1000"]), tmp_path / "run")
    assert result.stopped_by == "solved", result
    assert result.best_eval_return == 1000.0


def test_mujoco_presets_carry_rl_zoos_v3_scores():
    # benchmark.md's MuJoCo rows (-v3): PPO has none for Humanoid
    for env in ENVS[:5]:
        bench = next(f for f in all_files() if f.env == env).benchmark
        assert set(bench) == ({"sac", "td3"} if env == "Humanoid-v5" else {"ppo", "sac", "td3"})
        for entry in bench.values():
            assert entry["budget"] > 0 and isinstance(entry["zoo_score"], float)
