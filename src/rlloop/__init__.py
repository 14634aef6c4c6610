"""rlloop: a fast, exact-resume reinforcement-learning trainer on PyTorch.

``from rlloop import PPO, A2C, SAC, DQN, QRDQN, TD3, TQC, CrossQ, APPO, IMPALA, Callback, load``
(and the offline ``BC``, ``CQL``, ``IQL``) is the Python API (:mod:`rlloop.api`), and
``check_env`` checks a Gymnasium env (:mod:`rlloop.envs.checker`); they are imported on first
use, so ``import rlloop`` stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_API = {"PPO": "rlloop.api", "A2C": "rlloop.api", "DQN": "rlloop.api", "QRDQN": "rlloop.api",
        "SAC": "rlloop.api", "TD3": "rlloop.api", "TQC": "rlloop.api", "Model": "rlloop.api",
        "CrossQ": "rlloop.api", "BC": "rlloop.api", "CQL": "rlloop.api", "IQL": "rlloop.api",
        "load": "rlloop.api", "Callback": "rlloop.trainers.callbacks",
        "check_env": "rlloop.envs.checker", "APPO": "rlloop.api", "IMPALA": "rlloop.api"}
__all__ = ["A2C", "APPO", "BC", "CQL", "DQN", "IMPALA", "IQL", "PPO", "QRDQN", "SAC", "TD3", "TQC",
           "Callback", "CrossQ", "Model", "__version__", "check_env", "load"]

if TYPE_CHECKING:
    from rlloop.api import (
        A2C,
        APPO,
        BC,
        CQL,
        DQN,
        IMPALA,
        IQL,
        PPO,
        QRDQN,
        SAC,
        TD3,
        TQC,
        CrossQ,
        Model,
        load,
    )
    from rlloop.envs.checker import check_env
    from rlloop.trainers.callbacks import Callback


def __getattr__(name: str) -> Any:  # PEP 562: import the API (and torch) only when used
    if name in _API:
        import importlib

        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'rlloop' has no attribute {name!r}")
