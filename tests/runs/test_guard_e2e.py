"""The numerical guard end to end: a real PPO run on an env that emits NaNs at some steps.

The env is registered from this test (a Gymnasium id, in-process backend). Every 1500th
env step of the process is poisoned: its observation and reward are NaN.
"""

from __future__ import annotations

import itertools
import math

import gymnasium
import numpy as np
import pytest
import torch

from rlloop.checkpoint import CheckpointManager, load_checkpoint
from rlloop.config.run_config import build_config
from rlloop.learners.learner import NonFiniteError
from rlloop.runs.session import train

ENV_ID = "rlloop-test/NaNCartPole-v0"
SETS = ["mlflow=false", "progress=false", "stop_on_solve=false", "eval_every=0",
        "save_video=false", "num_envs=8", "total_env_steps=8192", "ppo.rollout_steps=32",
        "ppo.num_epochs=4", "ppo.minibatch_size=256", "eval_episodes=2"]


class PoisonEvery(gymnasium.Wrapper):
    """NaN observation and reward on every ``every``-th step, counted over all instances of
    this process (the sub-envs of a vector env step in lockstep, so a per-env count would
    poison them all in the same iteration)."""

    steps = itertools.count(1)

    def __init__(self, env: gymnasium.Env, every: int) -> None:
        super().__init__(env)
        self.every = every

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        if next(PoisonEvery.steps) % self.every == 0:
            obs, reward = np.full_like(obs, np.nan), float("nan")
        return obs, reward, terminated, truncated, info


def make_poisoned_cartpole(every: int = 1500, **kwargs) -> gymnasium.Env:
    return PoisonEvery(gymnasium.make("CartPole-v1", **kwargs), every)


@pytest.fixture(autouse=True)
def registered():
    gymnasium.register(ENV_ID, entry_point=make_poisoned_cartpole, disable_env_checker=True)
    PoisonEvery.steps = itertools.count(1)
    yield
    gymnasium.registry.pop(ENV_ID, None)


def policy_weights(run_dir) -> dict[str, torch.Tensor]:
    latest = CheckpointManager(run_dir / "checkpoints").latest()
    assert latest is not None
    state = load_checkpoint(latest).components["algorithm"]
    return state["learner"]["module"]["default_policy"]


def test_ppo_skips_poisoned_updates_and_keeps_finite_weights(tmp_path):
    result = train(build_config("ppo", ENV_ID, sets=SETS), tmp_path / "run")
    assert result.env_steps == 8192  # training completed
    skipped = result.last_stats["guard/skipped_updates"]
    iterations = 8192 // (8 * 32)
    assert 1 <= skipped <= 8192 // 1500 < iterations  # only poisoned batches were skipped
    weights = policy_weights(tmp_path / "run")
    assert weights and all(bool(torch.isfinite(w).all()) for w in weights.values())
    # The clean batches still trained the policy.
    assert math.isfinite(result.last_stats["losses/policy"])


def test_ppo_with_raise_stops_naming_the_step(tmp_path):
    with pytest.raises(NonFiniteError, match=r"non-finite observation, reward or target in "
                                             r"the batch at env step (\d+)") as info:
        train(build_config("ppo", ENV_ID, sets=[*SETS, "on_nonfinite=raise"]), tmp_path / "run")
    step = int(info.value.args[0].split("env step ")[1].split()[0])
    assert 1500 <= step <= 1500 + 8 * 32  # the first poisoned batch
    weights = policy_weights(tmp_path / "run")  # the final checkpoint was still written
    assert all(bool(torch.isfinite(w).all()) for w in weights.values())
