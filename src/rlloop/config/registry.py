"""The algorithm registry: each algorithm's name -> its config class and its constructor.

It names every algorithm without importing it: an entry imports its config module
(torch-free, in this package) the first time its config class is asked for, and its
algorithm module (under ``rlloop.algorithms``, with torch) the first time its constructor
is, so ``rlloop --help``, ``rlloop algos`` and bad input answer without torch's second of
import. The constructors are named by module path, not imported: the registry sits in the
torch-free config layer, below the algorithms it names.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal


@dataclass(frozen=True)
class AlgorithmEntry:
    """How to configure and build one algorithm, and which action spaces it supports.

    ``kind`` picks the trainer's schedule: ``"on_policy"`` runs collect + update
    iterations, ``"off_policy"`` the off-policy cadence (the algorithm then implements
    ``rlloop.trainers.offpolicy_schedule.OffPolicyAlgorithm``). ``config_module`` (torch-free) holds
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
    def build(self) -> Callable[[Any, Any], Any]:
        """``build(hparams, env_settings) -> AlgorithmBase`` (typed there: this layer names
        no algorithm class)."""
        return getattr(importlib.import_module(self.module), self.build_name)  # type: ignore[no-any-return]


_PPO_CONFIG = "rlloop.config.ppo"
_OFF_POLICY_CONFIG = "rlloop.config.offpolicy"

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
