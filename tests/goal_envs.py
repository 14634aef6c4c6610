"""Bit flipping (Andrychowicz et al. 2017, section 3.1), the goal env hindsight replay is
tested on: no MuJoCo needed, and without relabelling a random start almost never meets
its random goal, so an agent without HER barely learns.

``BitFlip-v0`` flips one bit per Discrete action (DQN); ``BitFlipBox-v0`` flips every bit
whose Box action is positive (SAC, TD3). Observations are Dicts of ``observation``,
``achieved_goal`` (both the bits) and ``desired_goal``; reward 0 on the goal, else -1;
the episode terminates on the goal and is truncated after ``n_bits`` steps. The whole
state (bits, then goal) is one numpy array, ``state``, which rlloop's Gymnasium adapter
saves in checkpoints: runs resume exactly mid-episode.
"""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces

N_BITS = 8


class BitFlip(gymnasium.Env):  # type: ignore[type-arg]
    def __init__(self, n_bits: int = N_BITS) -> None:
        self.n_bits = n_bits
        bits = spaces.Box(0.0, 1.0, (n_bits,), np.float32)
        self.observation_space = spaces.Dict(
            {"observation": bits, "achieved_goal": bits, "desired_goal": bits})
        self.action_space = spaces.Discrete(n_bits)
        self.state = np.zeros(2 * n_bits, np.float32)

    def _obs(self) -> dict[str, np.ndarray]:
        bits, goal = self.state[: self.n_bits], self.state[self.n_bits:]
        return {"observation": bits.copy(), "achieved_goal": bits.copy(),
                "desired_goal": goal.copy()}

    def compute_reward(self, achieved_goal: Any, desired_goal: Any, info: Any) -> np.ndarray:
        """0 where the goals match, -1 elsewhere; batched over leading dims."""
        return -np.any(np.asarray(achieved_goal) != np.asarray(desired_goal),
                       axis=-1).astype(np.float32)

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        self.state = self.np_random.integers(0, 2, 2 * self.n_bits).astype(np.float32)
        return self._obs(), {}

    def _flip(self, action: Any) -> None:
        self.state[int(action)] = 1.0 - self.state[int(action)]

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        self._flip(action)
        obs = self._obs()
        reward = float(self.compute_reward(obs["achieved_goal"], obs["desired_goal"], None))
        return obs, reward, reward == 0.0, False, {"is_success": reward == 0.0}


class BitFlipBox(BitFlip):
    def __init__(self, n_bits: int = N_BITS) -> None:
        super().__init__(n_bits)
        self.action_space = spaces.Box(-1.0, 1.0, (n_bits,), np.float32)

    def _flip(self, action: Any) -> None:
        flip = np.asarray(action)[: self.n_bits] > 0
        self.state[: self.n_bits] = np.where(flip, 1.0 - self.state[: self.n_bits],
                                             self.state[: self.n_bits])


class NoComputeReward(BitFlip):
    """Goal keys but no ``compute_reward`` (for the bad-input tests)."""

    compute_reward = None  # type: ignore[assignment]

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        self._flip(action)
        return self._obs(), 0.0, False, False, {}


class ScalarReward(BitFlip):
    """A ``compute_reward`` that scores one pair only (for the bad-input tests)."""

    def compute_reward(self, achieved_goal: Any, desired_goal: Any, info: Any) -> np.ndarray:
        return np.float32(-float(np.any(achieved_goal != desired_goal)))  # type: ignore[return-value]


class CostlyBitFlip(BitFlipBox):
    """A reward that reads ``info``: each step off the goal costs ``info["cost"]``, which
    grows along the episode (1.25, 1.5, ...), so that a step's reward scored with another
    step's info is wrong. The reset's info holds a cost of its own (0.5), which no step
    has. ``compute_reward`` takes one info dict or a sequence of them, one per row
    (Stable-Baselines3's ``copy_info_dict=True`` form). The steps taken are the last
    entry of ``state``, so a checkpoint continues the episode's costs."""

    def _obs(self) -> dict[str, np.ndarray]:
        n = self.n_bits
        return {"observation": self.state[:n].copy(), "achieved_goal": self.state[:n].copy(),
                "desired_goal": self.state[n: 2 * n].copy()}

    def compute_reward(self, achieved_goal: Any, desired_goal: Any, info: Any) -> np.ndarray:
        missed = -super().compute_reward(achieved_goal, desired_goal, info)
        costs = info["cost"] if isinstance(info, dict) else [i["cost"] for i in info]
        return -missed * np.asarray(costs, dtype=np.float64)

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[Any, dict]:
        super().reset(seed=seed, options=options)
        self.state = np.append(self.state, np.float32(0.0))
        return self._obs(), {"cost": 0.5}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        self._flip(action)
        self.state[-1] += 1
        obs, info = self._obs(), {"cost": 1.0 + 0.25 * float(self.state[-1])}
        reward = float(self.compute_reward(obs["achieved_goal"], obs["desired_goal"], info))
        info["is_success"] = reward == 0.0
        return obs, reward, reward == 0.0, False, info


def register() -> None:
    for name, cls in (("BitFlip", BitFlip), ("BitFlipBox", BitFlipBox),
                      ("CostlyBitFlip", CostlyBitFlip),
                      ("NoComputeReward", NoComputeReward), ("ScalarReward", ScalarReward)):
        if f"rlloop-test/{name}-v0" not in gymnasium.registry:
            gymnasium.register(f"rlloop-test/{name}-v0", entry_point=cls,
                               max_episode_steps=N_BITS)


register()  # on import too: a `--env goal_envs:rlloop-test/...` subprocess imports it
