"""Envs for backend parity tests; torch-free (async workers import this module)."""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces


class ListMask(gymnasium.Env):  # type: ignore[type-arg]
    """Returns ``info["action_mask"]`` as a plain Python list (action 0 always legal)."""

    observation_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = spaces.Discrete(4)

    def _info(self) -> dict[str, Any]:
        mask = [1] + [int(v) for v in self.np_random.integers(0, 2, 3)]
        return {"action_mask": mask}

    def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), self._info()

    def step(self, action: Any) -> Any:
        self.t += 1
        return np.zeros(2, np.float32), 0.0, False, self.t >= 5, self._info()


class GlobalRng(gymnasium.Env):  # type: ignore[type-arg]
    """Draws its observations from NumPy's global generator (an old-style env)."""

    observation_space = spaces.Box(0.0, 1.0, (1,), np.float32)
    action_space = spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
        super().reset(seed=seed)
        self.t = 0
        return np.array([np.random.random()], np.float32), {}

    def step(self, action: Any) -> Any:
        self.t += 1
        return np.array([np.random.random()], np.float32), 0.0, False, self.t >= 5, {}


for _name, _cls in (("ListMask", ListMask), ("GlobalRng", GlobalRng)):
    if f"rlloop-test/{_name}-v0" not in gymnasium.registry:
        gymnasium.register(f"rlloop-test/{_name}-v0", entry_point=_cls)
