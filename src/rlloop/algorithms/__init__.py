"""The algorithms: one module per algorithm (its learner, its build), and the bases they share.

What lives here: PPO (``ppo``, ``recurrent_ppo``), multi-agent PPO and its league (``ma_ppo``,
``league``), the off-policy family (``dqn``, ``sac``, ``td3`` on ``offpolicy_base``'s base
classes, ``offpolicy_loop``'s collect/replay loop and ``offpolicy_parts``' replaceable
parts), ``base`` (what every algorithm shares) and ``distributed`` (several learners). Their
configs live in ``rlloop.config.run_config`` (torch-free) and the name -> algorithm registry
in ``rlloop.config.registry``.

May import: ``rlloop.errors``, ``system``, ``config``, ``checkpoint``, ``logging``, ``losses``,
``modules``, ``envs``, ``data``, ``learners``, ``runners``; never the trainers, runs, cli or api
above it.
"""

from __future__ import annotations

import importlib
from typing import Any

# Where the classes this package exports live; imported on first access (PEP 562).
_EXPORTS = {"AlgorithmBase": "rlloop.algorithms.base", "EnvSettings": "rlloop.algorithms.base",
            "DQN": "rlloop.algorithms.dqn", "MultiAgentPPO": "rlloop.algorithms.ma_ppo",
            "PPO": "rlloop.algorithms.ppo", "SAC": "rlloop.algorithms.sac",
            "TD3": "rlloop.algorithms.td3", "DQNConfig": "rlloop.config.offpolicy",
            "SACConfig": "rlloop.config.offpolicy", "TD3Config": "rlloop.config.offpolicy",
            "MultiAgentPPOConfig": "rlloop.config.ppo", "PPOConfig": "rlloop.config.ppo"}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["DQN", "PPO", "SAC", "TD3", "AlgorithmBase", "DQNConfig", "EnvSettings",
           "MultiAgentPPO", "MultiAgentPPOConfig", "PPOConfig", "SACConfig", "TD3Config"]
