"""Envs for env-runner tests, importable by Ray runners (tests/ is on their path)."""

from __future__ import annotations

import os
import time
from typing import Any

import gymnasium
from gymnasium.envs.classic_control import CartPoleEnv

SLOW_ID = "rlloop-test/SlowFromSeed-v0"


class SlowFromSeed(CartPoleEnv):
    """CartPole that sleeps ``sleep_s`` per step when its first reset's seed is at least
    ``slow_from_seed``: with seeds ``base + i * M`` per runner, the later runners are slow
    and the first one fast."""

    def __init__(self, slow_from_seed: int = 2, sleep_s: float = 0.03, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.slow_from_seed, self.sleep_s, self.slow = slow_from_seed, sleep_s, False

    def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
        if seed is not None:
            self.slow = seed >= self.slow_from_seed
        return super().reset(seed=seed, options=options)

    def step(self, action: Any) -> Any:
        if self.slow:
            time.sleep(self.sleep_s)
        return super().step(action)


if SLOW_ID not in gymnasium.registry:
    gymnasium.register(SLOW_ID, entry_point=SlowFromSeed, max_episode_steps=500)

COUNTER_ID = "rlloop-test/Counter20-v0"


class Counter20(gymnasium.Env):  # type: ignore[type-arg]
    """Observation: the step index within the episode; reward 1; every episode ends after
    20 steps (terminated). A transition's steps can be read off its observations."""

    observation_space = gymnasium.spaces.Box(0.0, 20.0, (1,), "float32")
    action_space = gymnasium.spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action: Any) -> Any:
        self.t += 1
        return self._obs(), 1.0, self.t == 20, False, {}

    def _obs(self) -> Any:
        import numpy as np

        return np.array([self.t], np.float32)


if COUNTER_ID not in gymnasium.registry:
    gymnasium.register(COUNTER_ID, entry_point=Counter20)

HOME_ONLY_ID = "rlloop-test/HomeOnly-v0"


class HomeOnly(CartPoleEnv):
    """CartPole that cannot be made outside the process ``home_pid`` (a runner that can
    never start: its envs fail in its constructor, every time)."""

    def __init__(self, home_pid: int = 0, **kwargs: Any) -> None:
        if os.getpid() != home_pid:
            raise ValueError(f"HomeOnly can only be made in process {home_pid}")
        super().__init__(**kwargs)


if HOME_ONLY_ID not in gymnasium.registry:
    gymnasium.register(HOME_ONLY_ID, entry_point=HomeOnly, max_episode_steps=500)
