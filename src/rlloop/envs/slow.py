"""A slow env for scaling tests and benchmarks: CartPole that sleeps in every step.

Its step time is dominated by waiting (as a simulator, a game server or a robot is), not
by this machine's CPU, so it shows how sampling scales with the number of env runners
beyond the core count. Importing this module registers ``SlowCartPole-v1``; use it as
``--env rlloop.envs.slow:SlowCartPole-v1 --set env_kwargs.sleep_s=0.002``.
"""

from __future__ import annotations

import time
from typing import Any

import gymnasium

ENV_ID = "SlowCartPole-v1"


class SleepInStep(gymnasium.Wrapper):  # type: ignore[type-arg]
    """Sleeps ``sleep_s`` seconds before every step of the wrapped env."""

    def __init__(self, env: gymnasium.Env, sleep_s: float) -> None:  # type: ignore[type-arg]
        super().__init__(env)
        self.sleep_s = sleep_s

    def step(self, action: Any) -> Any:
        time.sleep(self.sleep_s)
        return self.env.step(action)


def make(sleep_s: float = 0.002, **kwargs: Any) -> gymnasium.Env:  # type: ignore[type-arg]
    return SleepInStep(gymnasium.make("CartPole-v1", **kwargs), sleep_s)


if ENV_ID not in gymnasium.registry:
    gymnasium.register(ENV_ID, entry_point=make, max_episode_steps=None, reward_threshold=475.0,
                       disable_env_checker=True)
