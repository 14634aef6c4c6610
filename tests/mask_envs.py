"""A Gymnasium env with per-state invalid actions, given as ``info["action_mask"]``."""

from __future__ import annotations

from typing import Any, ClassVar

import gymnasium
import numpy as np
from gymnasium import spaces

N_ACTIONS = 5


class MaskedChoice(gymnasium.Env[np.ndarray, np.int64]):
    """Each step a random subset of the 5 actions is legal; the observation one-hot codes
    the rewarded action (always legal). Taking an illegal action is counted, class-wide,
    in ``illegal`` (the envs of a SyncVectorEnv share this process), and ``steps`` counts
    every step, so a test can check that no masked action was ever taken."""

    illegal: ClassVar[int] = 0
    steps: ClassVar[int] = 0

    def __init__(self) -> None:
        self.observation_space = spaces.Box(0.0, 1.0, (N_ACTIONS,), np.float32)
        self.action_space = spaces.Discrete(N_ACTIONS)
        self._t = 0

    def _draw(self) -> tuple[np.ndarray, dict[str, Any]]:
        self._target = int(self.np_random.integers(N_ACTIONS))
        self._legal = (self.np_random.random(N_ACTIONS) < 0.4).astype(np.int8)
        self._legal[self._target] = 1
        return np.eye(N_ACTIONS, dtype=np.float32)[self._target], {"action_mask": self._legal}

    def reset(self, *, seed: int | None = None, options: Any = None
              ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self._t = 0
        return self._draw()

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        a = int(action)
        cls = MaskedChoice
        cls.steps += 1
        cls.illegal += int(not self._legal[a])
        reward = float(a == self._target)
        self._t += 1
        obs, info = self._draw()
        return obs, reward, False, self._t >= 8, info


class MaskedChoiceDict(MaskedChoice):
    """:class:`MaskedChoice` with a Dict observation (``{"target": one-hot}``) and its
    mask still in ``info["action_mask"]``. Counts into MaskedChoice's counters."""

    def __init__(self) -> None:
        super().__init__()
        self.observation_space = spaces.Dict(  # type: ignore[assignment]
            {"target": spaces.Box(0.0, 1.0, (N_ACTIONS,), np.float32)})

    def _draw(self) -> tuple[Any, dict[str, Any]]:
        obs, info = super()._draw()
        return {"target": obs}, info


def register() -> None:
    if "rlloop-test/MaskedChoice-v0" not in gymnasium.registry:
        gymnasium.register("rlloop-test/MaskedChoice-v0", entry_point=MaskedChoice)
        gymnasium.register("rlloop-test/MaskedChoiceDict-v0", entry_point=MaskedChoiceDict)


register()  # on import too: a `--env mask_envs:rlloop-test/...` subprocess imports it


def minigrid_dict() -> gymnasium.Env[Any, Any]:
    """MiniGrid's 5x5 empty room as a Dict of its 7x7x3 view and its direction (the free
    text mission dropped)."""
    import minigrid  # noqa: F401  (registers the MiniGrid ids)

    return gymnasium.wrappers.FilterObservation(gymnasium.make("MiniGrid-Empty-5x5-v0"),
                                                ["image", "direction"])


if "rlloop-test/MiniGridDict-v0" not in gymnasium.registry:
    gymnasium.register("rlloop-test/MiniGridDict-v0", entry_point=minigrid_dict)
