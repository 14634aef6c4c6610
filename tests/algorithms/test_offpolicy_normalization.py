"""Observation and reward normalisation for the off-policy algorithms (issue 45): the
replay keeps raw rows and a sample is normalised with the current statistics, which are
saved in checkpoints and restored exactly; Dict goal observations are standardised entry
by entry after hindsight relabelling (SB3's order: tests/data/test_hindsight_replay.py);
refused for images. That normalised SAC still learns is in
tests/learning/test_learning_offpolicy.py; HER with normalisation resumes exactly in
tests/reliability/test_her_resume.py."""

from __future__ import annotations

import dict_envs
import goal_envs
import numpy as np
import pytest
import torch
from conftest import leaves, same_leaf

from rlloop.checkpoint import CheckpointManager, load_checkpoint
from rlloop.cli.export import deterministic_policy
from rlloop.config.loading import build_config
from rlloop.data.replay_normalization import ReplayNormalizer
from rlloop.data.transitions import Transitions
from rlloop.errors import ConfigError
from rlloop.runs.build import build_algorithm
from rlloop.runs.predict import predict_actions
from rlloop.runs.start import resume, train

QUIET = ["mlflow=false", "progress=false", "save_video=false", "stop_on_solve=false"]
CASES = {
    "sac": ("Pendulum-v1", ["sac.hidden=[32,32]", "sac.batch_size=32", "sac.learning_starts=64",
                            "sac.eval_interval=100", "sac.record_interval=20"]),
    "dqn": ("CartPole-v1", ["dqn.hidden=[32,32]", "dqn.learning_starts=64",
                            "dqn.eval_interval=50", "dqn.record_interval=10"]),
}


def _config(algo: str, steps: int):
    env, sets = CASES[algo]
    return build_config(algo, env, flags={"seed": 3, "total_env_steps": steps, "num_envs": 2},
                        sets=[*QUIET, *sets, "eval_episodes=2", f"{algo}.normalize_obs=true",
                              f"{algo}.normalize_rewards=true"])


def _latest(run):
    return load_checkpoint(CheckpointManager(run / "checkpoints").latest())


@pytest.mark.parametrize("algo", sorted(CASES))
def test_normalised_off_policy_resume_is_bit_exact(tmp_path, algo):
    steps = 400
    train(_config(algo, steps), tmp_path / "a")
    train(_config(algo, steps // 2), tmp_path / "b")
    resume(tmp_path / "b", total_env_steps=steps)
    a, b = _latest(tmp_path / "a"), _latest(tmp_path / "b")
    assert a.components["trainer"]["counters"]["env/steps"] == steps
    norm = a.components["algorithm"]
    assert norm["obs_norm"]["count"] > steps  # updated by every training step
    assert norm["offpolicy"]["reward_norm"]["count"] > steps
    assert not torch.equal(norm["obs_norm"]["mean"], torch.zeros_like(norm["obs_norm"]["mean"]))
    la = dict(leaves({k: a.components[k] for k in ("algorithm", "rng")}))
    lb = dict(leaves({k: b.components[k] for k in ("algorithm", "rng")}))
    assert la.keys() == lb.keys()
    assert [k for k in la if not same_leaf(la[k], lb[k])] == []


def test_a_sample_scales_rewards_by_the_discounted_return_std_at_sampling_time():
    """The replay's reward is the env's; a sampled batch divides it by the running std of
    the discounted return (whose statistics see each env's return restart where its
    episode ends) and clips it at +-10, as VecNormalize does."""
    norm = ReplayNormalizer(2, 0.5, None, normalize_rewards=True)
    rewards = torch.tensor([[1.0, 2.0], [1.0, 2.0], [3.0, 0.0]])
    dones = torch.tensor([[False, True], [False, False], [False, False]])
    for t in range(3):
        norm.observe(rewards[t], dones[t], torch.zeros(2, 3))
    returns = torch.tensor([1.0, 2.0, 1.5, 2.0, 3.75, 1.0], dtype=torch.float64)
    assert torch.allclose(norm.reward_stats.mean, returns.mean(), atol=1e-6)
    stored = torch.tensor([3.0, 0.0, -100.0])
    t = Transitions(torch.zeros(3, 1), torch.zeros(3, 1), stored, torch.zeros(3, 1),
                    torch.zeros(3, dtype=torch.bool), torch.full((3,), 0.5))
    out = norm.batch(t).reward
    std = torch.sqrt(returns.var(unbiased=False)).float()
    assert torch.allclose(out[:2], stored[:2] / std, atol=1e-5)
    assert out[2] == -10.0
    assert torch.equal(t.reward, stored)  # the replay's rows stay raw


def test_the_replay_keeps_raw_observations_and_a_sample_standardises_them():
    """Pendulum's observation is (cos, sin, angular velocity): raw rows keep cos^2 + sin^2
    = 1, standardised ones do not. The policy and the learner see the rows standardised
    with the statistics of the moment, which every env step moves."""
    algo = build_algorithm(_config("sac", 200))
    try:
        for _ in range(60):
            algo.env_step()
        stats, loop = algo.obs_stats, algo.loop
        assert stats.count > 100
        raw = loop.replay.sample(64, torch.Generator().manual_seed(0))
        for obs in (raw.obs, raw.next_obs):
            assert torch.allclose(obs[:, 0] ** 2 + obs[:, 1] ** 2, torch.ones(64), atol=1e-5)
        batch = loop.normalizer.batch(raw)
        assert torch.allclose(batch.obs, stats.normalize(raw.obs))
        assert torch.allclose(batch.next_obs, stats.normalize(raw.next_obs))
    finally:
        algo.close()


@pytest.mark.parametrize(("env", "message"), [
    ("ALE/Pong-v5", r"^dqn\.normalize_obs takes vector \(float32\) observations, not "
                    r"ALE/Pong-v5's \(torch.uint8\)"),
    ("rlloop-test/DictCue-v0", r"^dqn\.normalize_obs takes vector entries, but "
                               r"rlloop-test/DictCue-v0's Dict observation has image entries "
                               r"\['pixels'\]; set dqn\.normalize_obs=false"),
])
def test_normalize_obs_is_refused_for_images(env, message):
    dict_envs.register()
    with pytest.raises(ConfigError, match=message):
        train(build_config("dqn", env, flags={"total_env_steps": 100},
                           sets=[*QUIET, "dqn.normalize_obs=true"]))


def test_goal_observations_are_standardised_entry_by_entry_after_relabelling():
    """HER with a Dict goal observation: the statistics cover each entry of the flat row;
    a sampled batch is the replay's relabelled one (goals and rewards from raw rows), then
    standardised; ``predict`` of a Dict observation, the exported policy and evaluation
    act on it standardised with the same statistics."""
    config = build_config("tqc", "rlloop-test/BitFlipBox-v0", flags={"seed": 0},
                          sets=[*QUIET, "num_envs=2", "tqc.replay=her", "tqc.hidden=[16,16]",
                                "tqc.normalize_obs=true", "tqc.normalize_rewards=true",
                                "tqc.learning_starts=16"])
    algo = build_algorithm(config)
    try:
        for _ in range(12):  # 8-step episodes: some have ended in both envs
            algo.env_step()
        stats, loop = algo.obs_stats, algo.loop
        assert stats.mean.shape == (3 * goal_envs.N_BITS,)
        state = loop.generator.get_state()
        raw = loop.replay.sample(64, loop.generator)
        loop.generator.set_state(state)
        batch = loop.sample(64, 0)
        parts = dict(loop.replay.layout.split(raw.next_obs))
        reached = (parts["achieved_goal"] == parts["desired_goal"]).all(-1)
        assert torch.equal(raw.reward, reached.float() - 1)  # scored on raw goals
        assert torch.equal(batch.obs, stats.normalize(raw.obs))
        assert torch.equal(batch.next_obs, stats.normalize(raw.next_obs))
        assert torch.equal(batch.reward, loop.normalizer.batch(raw).reward)
        assert not torch.equal(batch.reward, raw.reward)
        bits = np.array([1, 0] * (goal_envs.N_BITS // 2), np.float32)
        obs = {"achieved_goal": bits, "desired_goal": 1 - bits, "observation": bits}
        row = torch.as_tensor(np.concatenate([obs[k] for k, _, _ in algo.env.spec.obs_parts]))
        standardised, raw_row = (algo.act(x[None], True).numpy()[0]
                                 for x in (stats.normalize(row), row))
        assert np.array_equal(predict_actions(algo, obs, True, False), standardised)
        assert not np.allclose(standardised, raw_row)
        with torch.no_grad():  # what `rlloop export` writes takes the flat row
            exported = deterministic_policy(algo)(row[None]).numpy()[0]
        assert np.allclose(exported, standardised, atol=1e-6)
        evaluated = algo._eval_env({}, 1)  # evaluation reads the statistics, never moves them
        assert evaluated.stats is stats and not evaluated.update
    finally:
        algo.close()
