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
    """Sleeps ``sleep_s`` seconds before every step of the wrapped env; ``slower_by``
    times as long when its first reset's seed is in ``slow_seeds`` (``[low, high)``: one
    env runner's envs, whose seeds follow its own, so that its episodes take longer)."""

    def __init__(self, env: gymnasium.Env, sleep_s: float,  # type: ignore[type-arg]
                 slow_seeds: list[int] | None = None, slower_by: float = 10.0) -> None:
        super().__init__(env)
        self.sleep_s, self.slow_seeds, self.slower_by = sleep_s, slow_seeds, slower_by
        self._seeded = False

    def reset(self, **kwargs: Any) -> Any:
        seed = kwargs.get("seed")
        if seed is not None and not self._seeded and self.slow_seeds:
            self._seeded = True
            if self.slow_seeds[0] <= seed < self.slow_seeds[1]:
                self.sleep_s *= self.slower_by
        return self.env.reset(**kwargs)

    def step(self, action: Any) -> Any:
        time.sleep(self.sleep_s)
        return self.env.step(action)


def make(sleep_s: float = 0.002, slow_seeds: list[int] | None = None, slower_by: float = 10.0,
         **kwargs: Any) -> gymnasium.Env:  # type: ignore[type-arg]
    return SleepInStep(gymnasium.make("CartPole-v1", **kwargs), sleep_s, slow_seeds, slower_by)


if ENV_ID not in gymnasium.registry:
    gymnasium.register(ENV_ID, entry_point=make, max_episode_steps=None, reward_threshold=475.0,
                       disable_env_checker=True)
