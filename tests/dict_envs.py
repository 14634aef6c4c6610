"""Small Gymnasium envs with Dict observations: a vector entry beside a tiny uint8 image,
for the off-policy algorithms' Dict encoders, per-entry storage and masks."""

from __future__ import annotations

from typing import Any, ClassVar

import gymnasium
import numpy as np
from gymnasium import spaces

CUES = 3
N_ACTIONS = 2 * CUES


def _pixels(bright: float) -> np.ndarray:
    """A 2x2 grayscale frame of one brightness in [0, 1]."""
    return np.full((2, 2), round(255 * bright), np.uint8)


class DictCue(gymnasium.Env):  # type: ignore[type-arg]
    """Ten steps per episode; each step a cue (one-hot of 3, the ``cue`` entry) and a dark
    or bright 2x2 frame (``pixels``) name the one action of 6 (``2 * cue + bright``) that
    earns 1. Best return 10, random 10/6: reading both entries is needed to win.

    The whole state is one numpy array (``state``: cue, bright, then the legal actions),
    which rlloop's Gymnasium adapter saves in checkpoints (with the time limit's step
    count): runs resume exactly mid-episode."""

    observation_space = spaces.Dict({"cue": spaces.Box(0.0, 1.0, (CUES,), np.float32),
                                     "pixels": spaces.Box(0, 255, (2, 2), np.uint8)})
    action_space = spaces.Discrete(N_ACTIONS)

    def __init__(self) -> None:
        self.state = np.ones(2 + N_ACTIONS, np.int64)

    @property
    def target(self) -> int:
        return int(2 * self.state[0] + self.state[1])

    def _draw(self) -> None:
        self.state[:2] = self.np_random.integers(CUES), self.np_random.integers(2)

    def _obs(self) -> dict[str, np.ndarray]:
        return {"cue": np.eye(CUES, dtype=np.float32)[self.state[0]],
                "pixels": _pixels(float(self.state[1]))}

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        self._draw()
        return self._obs(), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        reward = float(int(action) == self.target)
        self._draw()
        return self._obs(), reward, False, False, {}  # the time limit truncates


class DictMaskedCue(DictCue):
    """``DictCue`` whose observation also has an ``action_mask`` entry: a random subset of
    the actions (the rewarded one always among them) is legal each step. Illegal actions
    taken are counted class-wide in ``illegal`` (a SyncVectorEnv's envs share this
    process), every step in ``steps``."""

    illegal: ClassVar[int] = 0
    steps: ClassVar[int] = 0
    observation_space = spaces.Dict({
        **DictCue.observation_space.spaces,
        "action_mask": spaces.Box(0, 1, (N_ACTIONS,), np.int8)})

    def _draw(self) -> None:
        super()._draw()
        self.state[2:] = self.np_random.random(N_ACTIONS) < 0.4
        self.state[2 + self.target] = 1

    def _obs(self) -> dict[str, np.ndarray]:
        return {**super()._obs(), "action_mask": self.state[2:].astype(np.int8)}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        cls = type(self)
        cls.steps += 1
        cls.illegal += int(not self.state[2 + int(action)])
        return super().step(action)


class DictReach(gymnasium.Env):  # type: ignore[type-arg]
    """One step: the action ``a`` in [-1, 1] earns ``-|a - (v + p) / 2|``, with ``v`` the
    ``vec`` entry and ``p`` in [-1, 1] the brightness of a 2x2 uint8 frame (``pixels``).
    Random actions get about -0.6; a policy that reads both entries gets near 0."""

    observation_space = spaces.Dict({"vec": spaces.Box(-1.0, 1.0, (1,), np.float32),
                                     "pixels": spaces.Box(0, 255, (2, 2), np.uint8)})
    action_space = spaces.Box(-1.0, 1.0, (1,), np.float32)

    def _obs(self) -> dict[str, np.ndarray]:
        v, bright = self.np_random.uniform(-1, 1), int(self.np_random.integers(256))
        self.target = (v + (bright / 127.5 - 1.0)) / 2
        return {"vec": np.array([v], np.float32), "pixels": _pixels(bright / 255)}

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        return self._obs(), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        reward = -abs(float(np.asarray(action).reshape(-1)[0]) - self.target)
        return self._obs(), reward, True, False, {}


class DictOfMultiDiscrete(DictCue):
    """A Dict with an entry no encoder takes (a MultiDiscrete)."""

    observation_space = spaces.Dict({"cue": spaces.Box(0.0, 1.0, (CUES,), np.float32),
                                     "dice": spaces.MultiDiscrete([3, 4])})


def register() -> None:
    for name, cls in (("DictCue", DictCue), ("DictMaskedCue", DictMaskedCue),
                      ("DictReach", DictReach), ("DictOfMultiDiscrete", DictOfMultiDiscrete)):
        if f"rlloop-test/{name}-v0" not in gymnasium.registry:
            gymnasium.register(f"rlloop-test/{name}-v0", entry_point=cls,
                               max_episode_steps=None if cls is DictReach else 10)


register()  # on import too: a `--env dict_envs:rlloop-test/...` subprocess imports it
