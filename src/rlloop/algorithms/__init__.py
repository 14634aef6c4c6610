"""Algorithm registry: name -> config class and constructor."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rlloop.algorithms.base import AlgorithmBase, EnvSettings
from rlloop.algorithms.ppo import PPO, PPOConfig


@dataclass(frozen=True)
class AlgorithmEntry:
    """How to configure and build one algorithm, and which action spaces it supports."""

    name: str
    config_cls: type
    build: Callable[[Any, EnvSettings], AlgorithmBase]
    discrete: bool = True
    continuous: bool = True


ALGORITHMS: dict[str, AlgorithmEntry] = {
    "ppo": AlgorithmEntry("ppo", PPOConfig, PPO),
}

__all__ = ["ALGORITHMS", "PPO", "AlgorithmBase", "AlgorithmEntry", "EnvSettings", "PPOConfig"]
