"""Observation and reward normalisation for the off-policy algorithms (issue 45): the
statistics are saved in checkpoints and restored exactly, and refused where the replay
cannot hold standardised observations."""

from __future__ import annotations

import pytest
import torch
from conftest import leaves, same_leaf

from rlloop.checkpoint import CheckpointManager, load_checkpoint
from rlloop.config.loading import build_config
from rlloop.envs.normalizer import RunningMeanStd
from rlloop.envs.wrappers import discounted_reward_scale
from rlloop.errors import ConfigError
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


def test_the_replay_stores_rewards_scaled_by_the_discounted_return_std():
    """The stored reward is the env's divided by the running std of the discounted return,
    whose statistics see each env's return restart where its episode ends."""
    stats, running = RunningMeanStd(), torch.zeros(2, dtype=torch.float64)
    rewards = torch.tensor([[1.0, 2.0], [1.0, 2.0], [3.0, 0.0]])
    dones = torch.tensor([[False, True], [False, False], [False, False]])
    for t in range(3):
        out = discounted_reward_scale(rewards[t][None], dones[t][None], running, stats, 0.5)
    returns = torch.tensor([1.0, 2.0, 1.5, 2.0, 3.75, 1.0], dtype=torch.float64)
    assert torch.allclose(stats.mean, returns.mean(), atol=1e-6)
    assert torch.allclose(out[0], rewards[2] / torch.sqrt(returns.var(unbiased=False)).float(),
                          atol=1e-5)


def test_normalize_obs_is_refused_for_image_observations():
    with pytest.raises(ConfigError, match=r"dqn\.normalize_obs takes vector"):
        train(build_config("dqn", "ALE/Pong-v5", flags={"total_env_steps": 100},
                           sets=[*QUIET, "dqn.normalize_obs=true"]))
