"""PPO through the "gymnasium-async" backend (one subprocess per env, Gymnasium's
AsyncVectorEnv): it trains, and no env process survives the end of the run."""

from __future__ import annotations

from proc_utils import live_children, still_alive

from rlloop.config.loading import build_config
from rlloop.runs.session import Session


def test_ppo_trains_through_async_gymnasium_envs(tmp_path):
    before = live_children()
    config = build_config("ppo", "CartPole-v1", flags={"backend": "gymnasium-async"},
                          sets=["mlflow=false", "progress=false", "stop_on_solve=false",
                                "num_envs=2", "ppo.rollout_steps=64", "ppo.minibatch_size=64",
                                "total_env_steps=512", "eval_every=2", "eval_episodes=2",
                                "save_video=false"])
    session = Session(config, tmp_path / "run")
    env_pids = live_children() - before
    assert len(env_pids) >= 2  # the training envs run in subprocesses
    result = session.run()
    assert result.env_steps == 512 and session.trainer.state["algorithm/steps"] == 4
    assert result.last_stats["losses/policy"] == result.last_stats["losses/policy"]  # not NaN
    assert "eval/return_mean" in result.last_stats
    assert still_alive(env_pids) == [] and live_children() == before
