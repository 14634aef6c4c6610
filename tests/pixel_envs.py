"""Small test envs for pixel observations and factorised action spaces."""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces


class SidePixels(gymnasium.Env):  # type: ignore[type-arg]
    """A 36x36 grayscale frame with a bright 12x12 square on the left or the right half;
    action 0 (left) or 1 (right) naming the side earns 1. Ten frames per episode, so the
    best return is 10 and a blind policy gets 5: only a policy that reads pixels wins."""

    observation_space = spaces.Box(0, 255, (36, 36, 1), np.uint8)
    action_space = spaces.Discrete(2)

    def __init__(self) -> None:
        self.side, self.t = 0, 0

    def _frame(self) -> np.ndarray:
        self.side = int(self.np_random.integers(2))
        frame = np.zeros((36, 36, 1), np.uint8)
        row, col = self.np_random.integers(0, 24), self.np_random.integers(0, 6)
        col += 18 * self.side
        frame[row:row + 12, col:col + 12] = 255
        return frame

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.t = 0
        return self._frame(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        reward = float(int(action) == self.side)
        self.t += 1
        return self._frame(), reward, self.t >= 10, False, {}


class TwoBandits(gymnasium.Env):  # type: ignore[type-arg]
    """Two independent bandits as one MultiDiscrete([3, 4]) action: arm 2 of the first
    pays 1, arm 1 of the second pays 1 (others 0). One step per episode; optimum 2."""

    observation_space = spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = spaces.MultiDiscrete([3, 4])

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        reward = float(action[0] == 2) + float(action[1] == 1)
        return np.zeros(1, np.float32), reward, True, False, {}


class BitPattern(gymnasium.Env):  # type: ignore[type-arg]
    """MultiBinary(4): one point per bit equal to 1, 0, 1, 1. One step; optimum 4."""

    observation_space = spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = spaces.MultiBinary(4)
    target = np.array([1, 0, 1, 1])

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        reward = float((np.asarray(action) == self.target).sum())
        return np.zeros(1, np.float32), reward, True, False, {}


class TextObs(TwoBandits):
    """Free-text observations: no encoder handles them."""

    observation_space = spaces.Text(8)


class StackedSide(gymnasium.Env):  # type: ignore[type-arg]
    """:class:`SidePixels` as 4 stacked 36x36 frames made by the env itself, its whole
    state in one numpy array (``state``: the stack, then side and step), which rlloop's
    Gymnasium adapter saves in checkpoints: runs on it resume exactly mid-episode."""

    observation_space = spaces.Box(0, 255, (4, 36, 36), np.uint8)
    action_space = spaces.Discrete(2)
    size = 4 * 36 * 36

    def __init__(self) -> None:
        self.state = np.zeros(self.size + 2, np.uint8)

    def _push(self, first: bool) -> None:
        side = int(self.np_random.integers(2))
        frame = np.zeros((36, 36), np.uint8)
        row, col = self.np_random.integers(0, 24), self.np_random.integers(0, 6) + 18 * side
        frame[row:row + 12, col:col + 12] = 255
        stack = self.state[: self.size].reshape(4, 36, 36)
        if first:
            stack[:] = frame
        else:
            stack[:-1] = stack[1:].copy()
            stack[-1] = frame
        self.state[self.size] = side

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.state[self.size + 1] = 0
        self._push(first=True)
        return self.state[: self.size].reshape(4, 36, 36).copy(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        reward = float(int(action) == int(self.state[self.size]))
        self.state[self.size + 1] += 1
        self._push(first=False)
        done = int(self.state[self.size + 1]) >= 10
        return self.state[: self.size].reshape(4, 36, 36).copy(), reward, done, False, {}


def register() -> None:
    for name, cls in (("SidePixels", SidePixels), ("TwoBandits", TwoBandits),
                      ("BitPattern", BitPattern), ("TextObs", TextObs),
                      ("StackedSide", StackedSide)):
        env_id = f"rlloop-test/{name}-v0"
        if env_id not in gymnasium.registry:
            gymnasium.register(env_id, entry_point=cls, max_episode_steps=50)


class SidePixelsBox(SidePixels):
    """:class:`SidePixels` with a continuous action in ``[-1, 1]``: its sign names the side."""

    action_space = spaces.Box(-1.0, 1.0, (1,), np.float32)

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        return super().step(int(float(np.asarray(action).reshape(-1)[0]) > 0))


def register_box() -> None:
    if "rlloop-test/SidePixelsBox-v0" not in gymnasium.registry:
        gymnasium.register("rlloop-test/SidePixelsBox-v0", entry_point=SidePixelsBox)


register()  # on import too: a `--env pixel_envs:rlloop-test/...` subprocess imports it
register_box()
