"""Algorithm registry: name -> config class and constructor.

The registry names every algorithm without importing it: an entry imports its module
(and with it torch) the first time its config class or constructor is asked for, so
``rlloop --help``, ``rlloop algos`` and bad input answer without torch's second of import.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from rlloop.algorithms.base import AlgorithmBase, EnvSettings
    from rlloop.algorithms.dqn import DQN, DQNConfig
    from rlloop.algorithms.ma_ppo import MultiAgentPPO, MultiAgentPPOConfig
    from rlloop.algorithms.ppo import PPO, PPOConfig
    from rlloop.algorithms.sac import SAC, SACConfig
    from rlloop.algorithms.td3 import TD3, TD3Config


@dataclass(frozen=True)
class AlgorithmEntry:
    """How to configure and build one algorithm, and which action spaces it supports.

    ``kind`` picks the trainer's schedule: ``"on_policy"`` runs rl8's collect + update
    iterations, ``"off_policy"`` border's cadence (the algorithm then implements
    ``rlloop.offpolicy_trainer.OffPolicyAlgorithm``). ``module`` holds ``config_name`` and
    ``build_name``; it is imported on first use of :attr:`config_cls` or :attr:`build`.
    """

    name: str
    module: str
    config_name: str
    build_name: str
    discrete: bool = True
    continuous: bool = True
    kind: Literal["on_policy", "off_policy"] = "on_policy"

    @property
    def config_cls(self) -> type:
        return getattr(importlib.import_module(self.module), self.config_name)  # type: ignore[no-any-return]

    @property
    def build(self) -> Callable[[Any, EnvSettings], AlgorithmBase]:
        return getattr(importlib.import_module(self.module), self.build_name)  # type: ignore[no-any-return]


ALGORITHMS: dict[str, AlgorithmEntry] = {
    # build_ppo makes a RecurrentPPO when ppo.recurrent is set.
    "ppo": AlgorithmEntry("ppo", "rlloop.algorithms.recurrent_ppo", "PPOConfig", "build_ppo"),
    "dqn": AlgorithmEntry("dqn", "rlloop.algorithms.dqn", "DQNConfig", "DQN",
                          continuous=False, kind="off_policy"),
    "sac": AlgorithmEntry("sac", "rlloop.algorithms.sac", "SACConfig", "SAC",
                          discrete=False, kind="off_policy"),
    "td3": AlgorithmEntry("td3", "rlloop.algorithms.td3", "TD3Config", "TD3",
                          discrete=False, kind="off_policy"),
    # PettingZoo envs (--env pettingzoo:<family>.<env>); it has its own multi-agent runner,
    # so it implements the trainer's protocol rather than subclassing AlgorithmBase.
    "ma_ppo": AlgorithmEntry("ma_ppo", "rlloop.algorithms.ma_ppo", "MultiAgentPPOConfig",
                             "MultiAgentPPO"),
}

# Where the classes this package exports live; imported on first access (PEP 562).
_EXPORTS = {"AlgorithmBase": "base", "EnvSettings": "base", "DQN": "dqn", "DQNConfig": "dqn",
            "MultiAgentPPO": "ma_ppo", "MultiAgentPPOConfig": "ma_ppo", "PPO": "ppo",
            "PPOConfig": "ppo", "SAC": "sac", "SACConfig": "sac", "TD3": "td3",
            "TD3Config": "td3"}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["ALGORITHMS", "DQN", "PPO", "SAC", "TD3", "AlgorithmBase", "AlgorithmEntry",
           "DQNConfig", "EnvSettings", "MultiAgentPPO",
           "MultiAgentPPOConfig", "PPOConfig", "SACConfig", "TD3Config"]
