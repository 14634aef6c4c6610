"""DQN, QR-DQN, SAC, TD3, TQC and CrossQ must learn: thresholds on real tasks within fixed
step budgets.

Each run trains through the public API with the shipped presets (rl-zoo's
hyperparameters), then the best policy is loaded from its checkpoint and evaluated afresh
on 20 deterministic episodes with seeds the training never saw. A run may stop early
once an evaluation clears a stricter bar than the test's; the fresh evaluation decides.
"""

from __future__ import annotations

import pytest

from rlloop.config.loading import build_config
from rlloop.runs.saved import evaluate_run
from rlloop.runs.start import train

QUIET = ["mlflow=false", "progress=false", "save_video=false"]


def _train_and_eval(tmp_path, algo, env, seed, sets=()):
    config = build_config(algo, env, flags={"seed": seed}, sets=[*QUIET, *sets])
    result = train(config, tmp_path / f"{algo}-{env}-{seed}")
    return result, evaluate_run(result.run_dir, episodes=20)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, pytest.param(1, marks=pytest.mark.heavy)])
def test_dqn_solves_cartpole(tmp_path, seed):
    # Seed 1 (about 40 s on one core) runs under -m heavy, to keep the default run under
    # 15 minutes; DQN also learns in it from a Dict observation (tests/test_dict_storage.py).
    result, ev = _train_and_eval(tmp_path, "dqn", "CartPole-v1", seed,
                                 ["total_env_steps=50000"])
    assert result.env_steps <= 50_000
    assert ev["return_mean"] >= 475, (result, ev)


@pytest.mark.slow
@pytest.mark.heavy
def test_qrdqn_solves_cartpole(tmp_path):
    # rl-zoo's qrdqn.yml preset: seed 0 solved it at 25k env steps in 43 s on a loaded
    # 2-core host, over the default run's budget for one test, hence heavy.
    result, ev = _train_and_eval(tmp_path, "qrdqn", "CartPole-v1", 0,
                                 ["total_env_steps=50000"])
    assert result.env_steps <= 50_000
    assert ev["return_mean"] >= 475, (result, ev)


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["sac", pytest.param("td3", marks=pytest.mark.heavy)])
def test_swings_up_pendulum_within_20k_steps(tmp_path, algo):
    # A random policy scores about -1200. Training may stop once an evaluation reaches
    # -150 (Pendulum-v1 has no reward_threshold of its own). The preset's [256, 256]
    # networks take 80-130 s on one core; [64, 64] swing up as soon (seeds 0 and 1 by
    # 6-7k steps) in about 45 s, the preset's networks are the zoo benchmark's. TD3's run
    # takes about 2.5 min on one core, so it is heavy; TD3 learns in the default run from
    # a Dict observation (tests/test_dict_storage.py).
    result, ev = _train_and_eval(tmp_path, algo, "Pendulum-v1", 0,
                                 ["total_env_steps=20000", "solve_threshold=-150",
                                  f"{algo}.hidden=[64,64]"])
    assert result.env_steps <= 20_000
    assert ev["return_mean"] >= -200, (result, ev)


@pytest.mark.slow
@pytest.mark.heavy
@pytest.mark.parametrize("seed", [0, 1])
def test_sac_with_both_normalisations_swings_up_pendulum_within_20k_steps(tmp_path, seed):
    # The plain SAC test's budget, network and bar, with observations and rewards
    # normalised (issue 45, item 12). When the replay stored rows normalised with the
    # statistics of their own step, seed 0 still scored about -1180 after 20k steps; with
    # raw rows normalised at sampling, seeds 0 and 1 stopped solved at 8.1k and 7.1k steps
    # and scored -155 and -146 afresh (97 and 94 s under pytest on the loaded 2-core host).
    result, ev = _train_and_eval(tmp_path, "sac", "Pendulum-v1", seed,
                                 ["total_env_steps=20000", "solve_threshold=-150",
                                  "sac.hidden=[64,64]", "sac.normalize_obs=true",
                                  "sac.normalize_rewards=true"])
    assert result.env_steps <= 20_000
    assert ev["return_mean"] >= -200, (result, ev)


@pytest.mark.slow
@pytest.mark.heavy
def test_tqc_swings_up_pendulum_within_20k_steps(tmp_path):
    # As SAC's test above, with TQC's quantile critics (2 x 25, the top 2 of each dropped);
    # [64, 64] networks keep it to minutes on one core, still heavy.
    result, ev = _train_and_eval(tmp_path, "tqc", "Pendulum-v1", 0,
                                 ["total_env_steps=20000", "solve_threshold=-150",
                                  "tqc.hidden=[64,64]"])
    assert result.env_steps <= 20_000
    assert ev["return_mean"] >= -200, (result, ev)


@pytest.mark.slow
@pytest.mark.heavy
def test_crossq_swings_up_pendulum_within_6k_steps(tmp_path):
    # CrossQ's sample efficiency: the shipped preset (rl-zoo's crossq.yml: [256, 256]
    # networks, policy_delay 2) within under a third of the 20k steps SAC's test allows.
    # Seed 0 evaluated at -157 after 3.1k env steps and -145 after 4.1k.
    result, ev = _train_and_eval(tmp_path, "crossq", "Pendulum-v1", 0,
                                 ["total_env_steps=6000", "solve_threshold=-150"])
    assert result.env_steps <= 6_000
    assert ev["return_mean"] >= -200, (result, ev)
