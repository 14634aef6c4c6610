"""Small envs for ``check_env``: one that passes, and one per planted defect."""

from __future__ import annotations

from typing import ClassVar

import gymnasium
import numpy as np
from gymnasium import spaces


class Good(gymnasium.Env):
    """A random walk on [-1, 1]^2 that does everything right."""

    metadata: ClassVar[dict] = {"render_modes": ["rgb_array"], "render_fps": 30}
    observation_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, render_mode=None):
        self.render_mode = render_mode
        self.pos = np.zeros(2, np.float32)
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = self.np_random.uniform(-0.5, 0.5, 2).astype(np.float32)
        self.t = 0
        return self.obs(), {}

    def obs(self):
        return self.pos.copy()

    def step(self, action):
        self.t += 1
        self.pos = np.clip(self.pos + (0.1 if action else -0.1), -1, 1).astype(np.float32)
        return self.obs(), float(self.pos.sum()), bool(self.t >= 8), False, {}

    def render(self):
        return np.zeros((8, 8, 3), np.uint8)


class NotAnEnv:
    observation_space = Good.observation_space
    action_space = Good.action_space


class NoObservationSpace(Good):
    observation_space = None


class InfiniteActions(Good):
    action_space = spaces.Box(-np.inf, np.inf, (1,), np.float32)

    def step(self, action):
        return super().step(int(action[0] > 0))


class OffsetActions(Good):
    action_space = spaces.Discrete(2, start=1)


class ResetWithoutSeed(Good):
    def reset(self):  # the old gym signature
        return super().reset()


class ResetReturnsObsOnly(Good):
    def reset(self, *, seed=None, options=None):
        return super().reset(seed=seed)[0]


class Float64Observations(Good):
    def obs(self):
        return self.pos.astype(np.float64)


class WrongShape(Good):
    def obs(self):
        return np.concatenate([self.pos, self.pos])


class OutOfBounds(Good):
    def obs(self):
        return self.pos * 5 + 3


class NaNObservations(Good):
    def step(self, action):
        _obs, *rest = super().step(action)
        return np.full(2, np.nan, np.float32), *rest


class OldStepAPI(Good):
    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, reward, terminated or truncated, info


class ArrayReward(Good):
    def step(self, action):
        obs, reward, *rest = super().step(action)
        return obs, np.array([reward]), *rest


class IntTerminated(Good):
    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, reward, int(terminated), truncated, info


class ListInfo(Good):
    def step(self, action):
        *rest, _info = super().step(action)
        return *rest, []


class Unseeded(Good):
    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = np.random.uniform(-0.5, 0.5, 2).astype(np.float32)  # not self.np_random
        self.t = 0
        return self.obs(), {}


class NoneFrames(Good):
    def render(self):
        return None


class NoRenderModeArgument(Good):
    def __init__(self):
        super().__init__()


class NoRenderModes(Good):
    metadata: ClassVar[dict] = {"render_fps": 30}


# For ``rlloop check-env checker_envs:CheckerGood-v0`` (Gymnasium imports the module first).
gymnasium.register("CheckerGood-v0", entry_point=Good)
gymnasium.register("CheckerOldStep-v0", entry_point=OldStepAPI)
gymnasium.register("CheckerNoRenderMode-v0", entry_point=NoRenderModeArgument)
