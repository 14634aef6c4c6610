"""Algorithm registry: name -> config class and constructor."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from rlloop.algorithms.base import AlgorithmBase, EnvSettings
from rlloop.algorithms.dqn import DQN, DQNConfig
from rlloop.algorithms.ma_ppo import MultiAgentPPO, MultiAgentPPOConfig
from rlloop.algorithms.ppo import PPO, PPOConfig
from rlloop.algorithms.recurrent_ppo import build_ppo
from rlloop.algorithms.sac import SAC, SACConfig
from rlloop.algorithms.td3 import TD3, TD3Config


@dataclass(frozen=True)
class AlgorithmEntry:
    """How to configure and build one algorithm, and which action spaces it supports.

    ``kind`` picks the trainer's schedule: ``"on_policy"`` runs rl8's collect + update
    iterations, ``"off_policy"`` border's cadence (the algorithm then implements
    ``rlloop.offpolicy_trainer.OffPolicyAlgorithm``).
    """

    name: str
    config_cls: type
    build: Callable[[Any, EnvSettings], AlgorithmBase]
    discrete: bool = True
    continuous: bool = True
    kind: Literal["on_policy", "off_policy"] = "on_policy"


ALGORITHMS: dict[str, AlgorithmEntry] = {
    "ppo": AlgorithmEntry("ppo", PPOConfig, build_ppo),  # RecurrentPPO with ppo.recurrent
    "dqn": AlgorithmEntry("dqn", DQNConfig, DQN, continuous=False, kind="off_policy"),
    "sac": AlgorithmEntry("sac", SACConfig, SAC, discrete=False, kind="off_policy"),
    "td3": AlgorithmEntry("td3", TD3Config, TD3, discrete=False, kind="off_policy"),
    # PettingZoo envs (--env pettingzoo:<family>.<env>); it has its own multi-agent runner,
    # so it implements the trainer's protocol rather than subclassing AlgorithmBase.
    "ma_ppo": AlgorithmEntry("ma_ppo", MultiAgentPPOConfig, MultiAgentPPO),  # type: ignore[arg-type]
}

__all__ = ["ALGORITHMS", "DQN", "PPO", "SAC", "TD3", "AlgorithmBase", "AlgorithmEntry",
           "DQNConfig", "EnvSettings", "MultiAgentPPO",
           "MultiAgentPPOConfig", "PPOConfig", "SACConfig", "TD3Config"]
