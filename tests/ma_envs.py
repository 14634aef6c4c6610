"""A tiny PettingZoo ParallelEnv for ma_ppo's edge cases (``pettingzoo:ma_envs``).

Agents ``a`` and ``b`` observe ``[t, own index, 1]`` (``b`` two more zeros with
``wide_b``) and act in ``Discrete(2)`` (``MultiDiscrete([2, 3])`` with ``multi_discrete``).
``a`` leaves at step 2 with reward 10; ``b`` earns 1 per step and is truncated at step 5.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv


class TwoAgents(ParallelEnv):  # type: ignore[misc]
    metadata: ClassVar[dict[str, str]] = {"name": "two_agents_v0"}

    def __init__(self, wide_b: bool = False, multi_discrete: bool = False) -> None:
        self.possible_agents = ["a", "b"]
        self.wide_b, self.multi_discrete = wide_b, multi_discrete
        self.t = 0

    def observation_space(self, agent: str) -> spaces.Box:
        return spaces.Box(-100, 100, (5 if self.wide_b and agent == "b" else 3,), np.float32)

    def action_space(self, agent: str) -> spaces.Space[Any]:
        return spaces.MultiDiscrete([2, 3]) if self.multi_discrete else spaces.Discrete(2)

    def _obs(self, agent: str) -> np.ndarray:
        obs = np.zeros(self.observation_space(agent).shape, np.float32)
        obs[:3] = self.t, self.possible_agents.index(agent), 1.0
        return obs

    def reset(self, seed: int | None = None, options: Any = None) -> tuple[dict, dict]:
        self.t, self.agents = 0, list(self.possible_agents)
        return {a: self._obs(a) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions: dict) -> tuple[dict, dict, dict, dict, dict]:
        self.t += 1
        leaves = "a" in self.agents and self.t == 2
        rewards = {a: 1.0 if a == "b" else 10.0 * leaves for a in self.agents}
        terminated = {a: a == "a" and leaves for a in self.agents}
        truncated = {a: self.t == 5 for a in self.agents}
        obs = {a: self._obs(a) for a in self.agents}
        self.agents = [a for a in self.agents if not (terminated[a] or truncated[a])]
        return obs, rewards, terminated, truncated, {a: {} for a in obs}


def parallel_env(**kwargs: Any) -> TwoAgents:
    return TwoAgents(**kwargs)
