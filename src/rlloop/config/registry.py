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
    #: Learns from a recorded dataset (``--dataset``): an off-policy cadence without env
    #: steps (``rlloop.trainers.offline_schedule``); the env only evaluates.
    offline: bool = False

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
_OFFLINE_CONFIG = "rlloop.config.offline"

ALGORITHMS: dict[str, AlgorithmEntry] = {
    # build_ppo makes a RecurrentPPO when ppo.recurrent is set.
    "ppo": AlgorithmEntry("ppo", "rlloop.algorithms.recurrent_ppo", _PPO_CONFIG, "PPOConfig",
                          "build_ppo"),
    "a2c": AlgorithmEntry("a2c", "rlloop.algorithms.a2c", "rlloop.config.a2c", "A2CConfig",
                          "A2C"),
    # Asynchronous: env runners in processes of their own sample while the learner learns.
    "appo": AlgorithmEntry("appo", "rlloop.algorithms.appo", "rlloop.config.appo",
                           "APPOConfig", "APPO"),
    "impala": AlgorithmEntry("impala", "rlloop.algorithms.appo", "rlloop.config.appo",
                             "IMPALAConfig", "IMPALA"),
    "dqn": AlgorithmEntry("dqn", "rlloop.algorithms.dqn", _OFF_POLICY_CONFIG, "DQNConfig",
                          "DQN", continuous=False, kind="off_policy"),
    "qrdqn": AlgorithmEntry("qrdqn", "rlloop.algorithms.qrdqn", "rlloop.config.quantile",
                            "QRDQNConfig", "QRDQN", continuous=False, kind="off_policy"),
    "sac": AlgorithmEntry("sac", "rlloop.algorithms.sac", _OFF_POLICY_CONFIG, "SACConfig",
                          "SAC", discrete=False, kind="off_policy"),
    "tqc": AlgorithmEntry("tqc", "rlloop.algorithms.tqc", "rlloop.config.quantile",
                          "TQCConfig", "TQC", discrete=False, kind="off_policy"),
    "crossq": AlgorithmEntry("crossq", "rlloop.algorithms.crossq", "rlloop.config.crossq",
                             "CrossQConfig", "CrossQ", discrete=False, kind="off_policy"),
    "td3": AlgorithmEntry("td3", "rlloop.algorithms.td3", _OFF_POLICY_CONFIG, "TD3Config",
                          "TD3", discrete=False, kind="off_policy"),
    "bc": AlgorithmEntry("bc", "rlloop.algorithms.bc", _OFFLINE_CONFIG, "BCConfig", "BC",
                         kind="off_policy", offline=True),
    "cql": AlgorithmEntry("cql", "rlloop.algorithms.cql", _OFFLINE_CONFIG, "CQLConfig",
                          "CQL", kind="off_policy", offline=True),
    "iql": AlgorithmEntry("iql", "rlloop.algorithms.iql", _OFFLINE_CONFIG, "IQLConfig",
                          "IQL", discrete=False, kind="off_policy", offline=True),
    # PettingZoo envs (--env pettingzoo:<family>.<env>); it has its own multi-agent runner,
    # so it implements the trainer's protocol rather than subclassing AlgorithmBase.
    "ma_ppo": AlgorithmEntry("ma_ppo", "rlloop.algorithms.ma_ppo", _PPO_CONFIG,
                             "MultiAgentPPOConfig", "MultiAgentPPO"),
}

#: Algorithms users ask for by name that rlloop does not offer yet, and what to use instead.
NOT_OFFERED = {
    "ddpg": "DDPG is not offered yet: use td3 (its successor)",
    "trpo": "TRPO is not offered yet: use ppo",
}


def unknown_algorithm(name: str) -> str:
    """The one-line refusal of an algorithm name: the names that exist, and for a known
    algorithm rlloop lacks, what comes closest."""
    closest = NOT_OFFERED.get(name.lower())
    return (f"unknown algorithm {name!r}; choose one of {sorted(ALGORITHMS)}"
            f"{'; ' + closest if closest else ''}")


def algorithm_name(text: str) -> str:
    """The registry's name for ``text`` in any case (``PPO`` -> ``ppo``); ``ValueError``
    with :func:`unknown_algorithm`'s line when there is none."""
    name = text.lower()
    if name not in ALGORITHMS:
        raise ValueError(unknown_algorithm(text))
    return name


def action_space_refusal(algo: str, env_id: str, space: str) -> str | None:
    """Why ``algo`` cannot act in ``env_id``'s action space (``space``: the Gymnasium
    space's class name), or None when it can."""
    entry = ALGORITHMS[algo]
    if space in ("MultiDiscrete", "MultiBinary") and algo not in ("ppo", "a2c"):
        takes = " or ".join(k for k, ok in (("Discrete", entry.discrete),
                                            ("Box", entry.continuous)) if ok)
        return (f"{algo} takes {takes} actions but {env_id} has {space} ones; use ppo or "
                "a2c for this env")
    if space == "Discrete" and not entry.discrete:
        fits = "bc or cql (offline)" if entry.offline else "ppo, a2c or dqn"
        return (f"{algo} needs continuous (Box) actions but {env_id} has discrete ones; use "
                f"{fits} for this env")
    if space == "Box" and not entry.continuous:
        return (f"{algo} needs discrete actions but {env_id} has continuous ones; use ppo, "
                "a2c, sac or td3 for this env")
    return None
