"""The numerical guard end to end: a real PPO run on an env that emits NaNs at some steps.

The env is registered from this test (a Gymnasium id, in-process backend). Every 1500th
env step of the process is poisoned: its observation and reward are NaN.
"""

from __future__ import annotations

import itertools
import logging
import math

import gymnasium
import pytest
import torch
from nan_envs import ALL_NAN_ID, PoisonEvery, make_poisoned_cartpole, nan_cartpole

from rlloop.checkpoint import CheckpointManager, load_checkpoint
from rlloop.cli.main import main
from rlloop.config.loading import build_config
from rlloop.learners.nonfinite import NonFiniteError
from rlloop.runs.start import train

ENV_ID = "rlloop-test/NaNCartPole-v0"
SETS = ["mlflow=false", "progress=false", "stop_on_solve=false", "eval_every=0",
        "save_video=false", "num_envs=8", "total_env_steps=8192", "ppo.rollout_steps=32",
        "ppo.num_epochs=4", "ppo.minibatch_size=256", "eval_episodes=2"]


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


@pytest.fixture
def all_nan_env():
    gymnasium.register(ALL_NAN_ID, entry_point=nan_cartpole, disable_env_checker=True)
    yield ALL_NAN_ID
    gymnasium.registry.pop(ALL_NAN_ID, None)


def train_argv(env_id: str, run_dir, *sets: str) -> list[str]:
    return ["train", "ppo", "--env", env_id, "--run-dir", str(run_dir), "--quiet",
            *(a for s in [*SETS, *sets] for a in ("--set", s))]


def test_a_run_that_skips_every_update_warns_then_stops_with_one_line(
        tmp_path, all_nan_env, capsys, caplog):
    """Every batch of an env that returns NaN is skipped: the run used to end with exit 0
    and "best eval return: n/a". Now the first record warns, and ten records in a row of
    skipped updates stop it with one line (exit 2), its final checkpoint written."""
    with caplog.at_level(logging.WARNING, logger="rlloop.runs.session"):
        code = main(train_argv(all_nan_env, tmp_path / "run"))
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("rlloop: error: 100% of the updates of the last 10 metrics "
                               "records (to env step 2,560) were skipped"), lines[0]
    assert "raise max_skipped_share" in lines[0]
    warnings = [r.getMessage() for r in caplog.records if "being skipped" in r.getMessage()]
    assert len(warnings) == 1 and "up to env step 256 " in warnings[0], warnings  # at once
    weights = policy_weights(tmp_path / "run")  # the final checkpoint was still written
    assert all(bool(torch.isfinite(w).all()) for w in weights.values())
    assert CheckpointManager(tmp_path / "run" / "checkpoints").latest().name.endswith("2560")


def test_a_short_run_that_skipped_everything_fails_at_its_end(tmp_path, all_nan_env):
    """Fewer records than the window: the end of the run judges all of them."""
    with pytest.raises(NonFiniteError, match=r"100% of the updates of the last 3 metrics "):
        train(build_config("ppo", all_nan_env, sets=[*SETS, "total_env_steps=768"]),
              tmp_path / "run")


def test_the_share_of_skipped_updates_that_stops_a_run_is_a_setting(tmp_path, all_nan_env):
    # 1: never stop (the run trains its budget, skipping everything, as before).
    result = train(build_config("ppo", all_nan_env, sets=[*SETS, "max_skipped_share=1"]),
                   tmp_path / "never")
    assert result.env_steps == 8192 and result.last_stats["guard/skipped_updates"] == 32
    # 0: any skipped update over 10 records stops it; the default lets the same run
    # (a NaN every 1500 steps) finish, as the first test here shows.
    with pytest.raises(NonFiniteError, match="max_skipped_share=0:"):
        train(build_config("ppo", ENV_ID, sets=[*SETS, "max_skipped_share=0"]),
              tmp_path / "strict")


def test_an_off_policy_run_that_skips_every_update_stops(tmp_path, all_nan_env):
    """DQN skips on the device; the records read its counts."""
    sets = ["mlflow=false", "progress=false", "stop_on_solve=false", "save_video=false",
            "num_envs=1", "total_env_steps=2000", "eval_episodes=1", "dqn.learning_starts=32",
            "dqn.opt_interval=1", "dqn.record_interval=10", "dqn.eval_interval=100000",
            "dqn.batch_size=16"]
    with pytest.raises(NonFiniteError, match="100% of the updates of the last 10 metrics "
                                             r"records \(to env step 132\)"):
        train(build_config("dqn", all_nan_env, sets=sets), tmp_path / "run")
