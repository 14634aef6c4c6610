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
    from rlloop.algorithms.dqn import DQN
    from rlloop.algorithms.ma_ppo import MultiAgentPPO
    from rlloop.algorithms.offpolicy_config import DQNConfig, SACConfig, TD3Config
    from rlloop.algorithms.ppo import PPO
    from rlloop.algorithms.ppo_config import MultiAgentPPOConfig, PPOConfig
    from rlloop.algorithms.sac import SAC
    from rlloop.algorithms.td3 import TD3


@dataclass(frozen=True)
class AlgorithmEntry:
    """How to configure and build one algorithm, and which action spaces it supports.

    ``kind`` picks the trainer's schedule: ``"on_policy"`` runs rl8's collect + update
    iterations, ``"off_policy"`` the off-policy cadence (the algorithm then implements
    ``rlloop.offpolicy_trainer.OffPolicyAlgorithm``). ``config_module`` (torch-free) holds
    ``config_name`` and ``module`` holds ``build_name``; each is imported on first use of
    :attr:`config_cls` or :attr:`build`, so reading a config's fields needs no torch.
    """

    name: str
    module: str
    config_module: str
    config_name: str
    build_name: str
    discrete: bool = True
    continuous: bool = True
    kind: Literal["on_policy", "off_policy"] = "on_policy"

    @property
    def config_cls(self) -> type:
        return getattr(importlib.import_module(self.config_module), self.config_name)  # type: ignore[no-any-return]

    @property
    def build(self) -> Callable[[Any, EnvSettings], AlgorithmBase]:
        return getattr(importlib.import_module(self.module), self.build_name)  # type: ignore[no-any-return]


_PPO_CONFIG = "rlloop.algorithms.ppo_config"
_OFF_POLICY_CONFIG = "rlloop.algorithms.offpolicy_config"

ALGORITHMS: dict[str, AlgorithmEntry] = {
    # build_ppo makes a RecurrentPPO when ppo.recurrent is set.
    "ppo": AlgorithmEntry("ppo", "rlloop.algorithms.recurrent_ppo", _PPO_CONFIG, "PPOConfig",
                          "build_ppo"),
    "dqn": AlgorithmEntry("dqn", "rlloop.algorithms.dqn", _OFF_POLICY_CONFIG, "DQNConfig",
                          "DQN", continuous=False, kind="off_policy"),
    "sac": AlgorithmEntry("sac", "rlloop.algorithms.sac", _OFF_POLICY_CONFIG, "SACConfig",
                          "SAC", discrete=False, kind="off_policy"),
    "td3": AlgorithmEntry("td3", "rlloop.algorithms.td3", _OFF_POLICY_CONFIG, "TD3Config",
                          "TD3", discrete=False, kind="off_policy"),
    # PettingZoo envs (--env pettingzoo:<family>.<env>); it has its own multi-agent runner,
    # so it implements the trainer's protocol rather than subclassing AlgorithmBase.
    "ma_ppo": AlgorithmEntry("ma_ppo", "rlloop.algorithms.ma_ppo", _PPO_CONFIG,
                             "MultiAgentPPOConfig", "MultiAgentPPO"),
}

# Where the classes this package exports live; imported on first access (PEP 562).
_EXPORTS = {"AlgorithmBase": "base", "EnvSettings": "base", "DQN": "dqn",
            "DQNConfig": "offpolicy_config", "MultiAgentPPO": "ma_ppo",
            "MultiAgentPPOConfig": "ppo_config", "PPO": "ppo", "PPOConfig": "ppo_config",
            "SAC": "sac", "SACConfig": "offpolicy_config", "TD3": "td3",
            "TD3Config": "offpolicy_config"}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["ALGORITHMS", "DQN", "PPO", "SAC", "TD3", "AlgorithmBase", "AlgorithmEntry",
           "DQNConfig", "EnvSettings", "MultiAgentPPO",
           "MultiAgentPPOConfig", "PPOConfig", "SACConfig", "TD3Config"]
