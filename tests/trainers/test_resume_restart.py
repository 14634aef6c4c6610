"""A resume that cannot continue its envs' episodes restarts them at the cut.

Gymnasium envs without a numpy ``unwrapped.state`` (Atari among them) and envpool give
back only their RNGs: a resumed run's env is a fresh one. The runner's saved observation
was paired with that fresh env's next step as one transition (DQN's frame replay then
refused it; a uniform replay stored it silently). Now every episode restarts at the cut.
"""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
import torch
from gymnasium import spaces

from rlloop.config.loading import build_config
from rlloop.runs.build import build_algorithm

QUIET = ["mlflow=false", "progress=false", "save_video=false"]


class Counter(gymnasium.Env):  # type: ignore[type-arg]
    """Observation t / 10 at step t of an episode; no ``state`` attribute to save."""

    observation_space = spaces.Box(0.0, 10.0, (1,), np.float32)
    action_space = spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0], np.float32), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        self.t += 1
        return np.array([self.t / 10], np.float32), 0.0, False, False, {}


if "rlloop-test/Counter-v0" not in gymnasium.registry:
    gymnasium.register("rlloop-test/Counter-v0", entry_point=Counter, max_episode_steps=50)


def _steps(algorithm: Any, n: int) -> None:
    for _ in range(n):
        algorithm.collect()
        algorithm.update(algorithm.loop.env_steps)


def test_a_resume_restarts_episodes_an_env_cannot_continue():
    config = build_config("dqn", "rlloop-test/Counter-v0", flags={"seed": 0, "num_envs": 2},
                          sets=[*QUIET, "dqn.learning_starts=4", "dqn.batch_size=4",
                                "dqn.replay=uniform", "dqn.n_step=3"])
    first = build_algorithm(config)
    _steps(first, 7)  # mid-episode: observations 0.7
    state = first.get_state()
    first.close()
    resumed = build_algorithm(config)
    try:
        resumed.set_state(state)
        assert resumed.runner.restarted_at_resume
        assert torch.equal(resumed.runner.obs, torch.zeros(2, 1))  # the episodes restarted
        _steps(resumed, 5)
        replay = resumed.loop.replay
        rows = torch.arange(len(replay))
        obs, nxt = replay._obs("obs", rows), replay._obs("next_obs", rows)
        # every stored transition lies inside one episode: n-step windows of 3 steps (or
        # fewer) and never the old episode's observation before the new one's next
        gaps = (nxt - obs).flatten()
        assert ((gaps > 0.05) & (gaps < 0.35)).all(), gaps
    finally:
        resumed.close()


class Rewarded(Counter):
    """Counter with a reward of 1 per step: the reward normaliser's return grows."""

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        obs, _, term, trunc, info = super().step(action)
        return obs, 1.0, term, trunc, info


if "rlloop-test/Rewarded-v0" not in gymnasium.registry:
    gymnasium.register("rlloop-test/Rewarded-v0", entry_point=Rewarded, max_episode_steps=50)

PPO_SMALL = [*QUIET, "ppo.normalize_rewards=true", "ppo.rollout_steps=8",
             "ppo.minibatch_size=16", "ppo.num_epochs=1"]


def test_the_reward_normalisers_return_restarts_with_the_episodes_at_a_resume():
    config = build_config("ppo", "rlloop-test/Rewarded-v0", flags={"num_envs": 2},
                          sets=PPO_SMALL)
    first = build_algorithm(config)
    first.collect()
    first.update(16)  # 8 steps into 50-step episodes: a discounted return of ~7.7 each
    state = first.get_state()
    first.close()
    assert (state["reward_norm"]["running"] > 7).all()
    resumed = build_algorithm(config)
    try:
        resumed.set_state(state)
        assert resumed.runner.restarted_at_resume
        assert torch.count_nonzero(resumed.reward_running) == 0  # VecNormalize's reset
        assert resumed.reward_stats.count == first.reward_stats.count  # statistics kept
    finally:
        resumed.close()


def test_the_reward_normalisers_return_restarts_at_a_horizon_reset():
    config = build_config("ppo", "rlloop-test/Rewarded-v0", flags={"num_envs": 2},
                          sets=[*PPO_SMALL, "horizons_per_env_reset=1"])
    algorithm = build_algorithm(config)
    try:
        algorithm.begin_horizon(0, None)
        algorithm.collect()
        algorithm.update(16)
        assert torch.count_nonzero(algorithm.reward_running) == 2
        algorithm.begin_horizon(1, None)  # every env starts a new episode
        assert torch.count_nonzero(algorithm.reward_running) == 0
    finally:
        algorithm.close()


def _episode_lengths_after_resume(algo: str, env: str, config_key: str, sets: list[str]
                                  ) -> float:
    from rlloop.trainers.loop import Trainer

    config = build_config(algo, env, flags={"num_envs": 2},
                          sets=[*QUIET, "horizons_per_env_reset=-1", *sets])
    first = build_algorithm(config)
    Trainer(first).step(env_config={config_key: 5})
    state = first.get_state()
    first.close()
    resumed = build_algorithm(config)
    try:
        resumed.set_state(state)
        trainer = Trainer(resumed)
        for _ in range(3):
            stats = trainer.step(env_config={config_key: 5})
        return stats["episode/length_mean"]
    finally:
        resumed.close()


def test_a_resumed_run_trains_on_its_saved_env_config():
    """Trainer.step(env_config=...) (rl8's per-horizon env settings) holds after a resume:
    the envs are made again with it, not left with the run's env_kwargs alone."""
    assert _episode_lengths_after_resume(
        "ppo", "CartPole-v1", "max_episode_steps",
        ["backend=gymnasium", "ppo.rollout_steps=16", "ppo.minibatch_size=32"]) == 5.0
    assert _episode_lengths_after_resume(
        "ma_ppo", "pettingzoo:classic.rps_v2", "max_cycles",
        ["ma_ppo.rollout_steps=16", "ma_ppo.minibatch_size=16"]) == 5.0
