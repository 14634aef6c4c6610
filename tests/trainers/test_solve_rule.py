"""The solve rule: a lucky evaluation of a few episodes does not stop a run."""

from __future__ import annotations

import json

import gymnasium
import numpy as np
from gymnasium import spaces

from rlloop.config.loading import build_config
from rlloop.runs.start import train

COIN = "RlloopTestCoinFlip-v0"


class CoinFlip(gymnasium.Env):
    """One-step episodes whose reward is a fair coin, whatever the action: every
    policy's true mean return is 0.5."""

    observation_space = spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action):
        reward = float(self.np_random.random() < 0.5)
        return np.zeros(1, np.float32), reward, True, False, {}


if COIN not in gymnasium.registry:
    gymnasium.register(id=COIN, entry_point=CoinFlip, reward_threshold=0.9)


def test_a_lucky_short_evaluation_does_not_count_as_solved(tmp_path):
    # Two-episode evaluations reach 0.9 a quarter of the time; 100 episodes never do.
    config = build_config("ppo", COIN, sets=[
        "num_envs=4", "ppo.rollout_steps=8", "ppo.minibatch_size=32", "eval_every=1",
        "eval_episodes=2", "total_env_steps=640", "mlflow=false", "progress=false",
        "save_video=false"])
    result = train(config, tmp_path / "run")

    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    # (at the last step the budget stops the run before the solve rule is asked)
    lucky = [r["step"] for r in rows if r.get("eval/return_mean", 0.0) >= 0.9 and r["step"] < 640]
    confirmed = [r["eval/solve_return_mean"] for r in rows if "eval/solve_return_mean" in r]
    assert lucky, "no lucky evaluation happened; pick another seed"
    assert len(confirmed) == len(lucky) and max(confirmed) < 0.7
    assert result.stopped_by == "budget" and result.env_steps == 640


def test_a_confirmed_solve_stops_the_run(tmp_path):
    config = build_config("ppo", COIN, sets=[
        "num_envs=4", "ppo.rollout_steps=8", "ppo.minibatch_size=32", "eval_every=1",
        "eval_episodes=2", "total_env_steps=640", "solve_threshold=0.3", "mlflow=false",
        "progress=false", "save_video=false"])
    result = train(config, tmp_path / "run")
    assert result.stopped_by == "solved" and result.env_steps == 32


def _session(algo: str, env: str, tmp_path, *sets: str):  # type: ignore[no-untyped-def]
    from rlloop.runs.session import Session

    config = build_config(algo, env, sets=["mlflow=false", "progress=false",
                                           "save_video=false", *sets])
    return Session(config, tmp_path / "run")


def test_a_stochastic_evaluator_acts_stochastically_in_every_evaluation(tmp_path):
    """The final evaluation and the solve confirmation used the greedy policy whatever
    <algo>.evaluator said, and competed with the stochastic ones for best/."""
    session = _session("sac", "Pendulum-v1", tmp_path, "sac.evaluator=stochastic",
                       "total_env_steps=250", "num_envs=1", "sac.learning_starts=100",
                       "sac.eval_interval=100", "sac.hidden=[16]", "sac.batch_size=16",
                       "eval_episodes=1", "solve_threshold=-100000", "solve_episodes=2")
    evaluate, greedy = session.algorithm.evaluate, []

    def recorded(episodes, env_config=None, deterministic=True):  # type: ignore[no-untyped-def]
        greedy.append(deterministic)
        return evaluate(episodes, env_config, deterministic)

    session.algorithm.evaluate = recorded
    result = session.run()
    assert result.stopped_by == "solved" and len(greedy) >= 2  # an eval and its confirmation
    assert not any(greedy), greedy


def test_an_off_policy_run_stops_at_the_optimisation_step_that_solved_it(tmp_path):
    """Four optimisation steps fall due per env step (4 envs, opt_interval 1): the run
    solved at the second went on with the other two (and logged their evaluations)."""
    session = _session("dqn", "CartPole-v1", tmp_path, "num_envs=4", "dqn.opt_interval=1",
                       "dqn.gradient_steps=1", "dqn.learning_starts=16", "dqn.batch_size=8",
                       "dqn.eval_interval=2", "eval_episodes=1", "solve_threshold=1",
                       "solve_episodes=1", "total_env_steps=4000")
    result = session.run()
    assert result.stopped_by == "solved"
    assert session.trainer.state["algorithm/steps"] == 2
