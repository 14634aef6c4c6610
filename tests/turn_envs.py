"""A turn-based PettingZoo AEC game without action masks: agents a and b alternate for
``moves`` moves; the mover's reward is its action. ``pettingzoo:turn_envs`` makes it."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
from gymnasium import spaces
from pettingzoo import AECEnv
from pettingzoo.utils.agent_selector import AgentSelector


class Alternate(AECEnv):  # type: ignore[misc]
    metadata: ClassVar[dict[str, Any]] = {"name": "alternate_v0"}
    render_mode = None

    def __init__(self, moves: int = 4) -> None:
        self.possible_agents = ["a", "b"]
        self.moves = moves

    def observation_space(self, agent: str) -> spaces.Box:
        return spaces.Box(0.0, 1.0, (1,), np.float32)

    def action_space(self, agent: str) -> spaces.Discrete:
        return spaces.Discrete(2)

    def observe(self, agent: str) -> np.ndarray:
        return np.array([float(self.agent_selection == agent)], np.float32)

    def reset(self, seed: int | None = None, options: Any = None) -> None:
        self.agents = self.possible_agents[:]
        self.rewards = {a: 0.0 for a in self.agents}
        self._cumulative_rewards = dict(self.rewards)
        self.terminations = {a: False for a in self.agents}
        self.truncations = dict(self.terminations)
        self.infos: dict[str, dict[str, Any]] = {a: {} for a in self.agents}
        self._selector = AgentSelector(self.agents)
        self.agent_selection = self._selector.reset()
        self.t = 0

    def step(self, action: Any) -> None:
        if self.terminations[self.agent_selection] or self.truncations[self.agent_selection]:
            self._was_dead_step(action)
            return
        self.rewards = {a: 0.0 for a in self.agents}
        self.rewards[self.agent_selection] = float(action)
        self.t += 1
        if self.t >= self.moves:
            self.terminations = {a: True for a in self.agents}
        self._cumulative_rewards = {a: 0.0 for a in self.agents}
        self._accumulate_rewards()
        self.agent_selection = self._selector.next()


def env(**kwargs: Any) -> Alternate:
    return Alternate(**kwargs)
