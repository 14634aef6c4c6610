"""CartPole envs that return NaN observations and rewards, for the numerical guard's tests
(tests/runs/test_guard_e2e.py) and the tuner's (a trial whose every update is skipped)."""

from __future__ import annotations

import itertools

import gymnasium
import numpy as np


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


def nan_cartpole(**kwargs) -> gymnasium.Env:
    """CartPole whose every step is poisoned: no batch is ever finite."""
    return make_poisoned_cartpole(every=1, **kwargs)


ALL_NAN_ID = "rlloop-test/AllNaNCartPole-v0"
