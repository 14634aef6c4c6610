"""The offline family's settings (BC, CQL, IQL): dataclasses with a docstring under every
field, checked when built, and what a dataset's Minari metadata says, read without torch.

An offline run learns from a recorded dataset and never steps its env to learn: the env
(given with ``--env``, else the one the dataset names) only evaluates. Its budget is
``total_gradient_steps``; evaluations, records and checkpoints count gradient steps too.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from rlloop.config.offpolicy import check_hidden
from rlloop.errors import ConfigError, check_finite

#: A dataset named so is read from Minari's local store (``MINARI_DATASETS_PATH``); any
#: other name is a directory.
MINARI_PREFIX = "minari:"


@dataclass
class OfflineConfig:
    """Settings every offline algorithm shares (its section: ``bc.``, ``cql.``, ``iql.``)."""

    section: ClassVar[str] = "offline"
    #: Read by the run's checks, which count an offline run's evaluations as the
    #: off-policy ones do (in its own intervals).
    UNUSED_WHEN: ClassVar[tuple[Any, ...]] = ()
    #: Learning rates stay constant: the optimisers' schedules count env steps, which an
    #: offline run never takes.
    lr_schedule: ClassVar[str] = "constant"
    lr_decay_steps: ClassVar[int] = 1

    dataset: str = ""
    """The dataset to learn from: a directory ``rlloop collect`` wrote (a Minari dataset:
    ``<dir>/data/metadata.json`` and its episodes), or ``minari:ID`` for a dataset in
    Minari's local store (``MINARI_DATASETS_PATH``, default ``~/.minari/datasets``).
    Nothing is downloaded."""
    total_gradient_steps: int = 100_000
    """Gradient updates to train for: the run's budget (an offline run takes no env
    steps, so ``total_env_steps`` does not bound it)."""
    batch_size: int = 256
    """Transitions per gradient update, sampled uniformly from the whole dataset."""
    gamma: float = 0.99
    """Discount factor."""
    lr: float = 3e-4
    """Adam learning rate of every network."""
    hidden: list[int] = field(default_factory=lambda: [256, 256])
    """Hidden layer sizes of each network (ReLU)."""
    eval_interval: int = 5_000
    """Gradient steps between evaluations in the env; a new best is saved under
    <run>/best."""
    record_interval: int = 1_000
    """Gradient steps between records (losses, opt/steps_per_sec)."""
    save_interval: int = 0
    """Gradient steps between checkpoints <run>/checkpoints/<gradient steps> (0: never; a
    final checkpoint is always written)."""

    def __post_init__(self) -> None:
        s = self.section
        check_finite(s, self)
        for name in ("total_gradient_steps", "batch_size", "eval_interval", "record_interval"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{s}.{name} must be > 0, got {getattr(self, name)}")
        if self.save_interval < 0:
            raise ConfigError(f"{s}.save_interval must be >= 0, got {self.save_interval}")
        if not 0 < self.gamma <= 1:
            raise ConfigError(f"{s}.gamma must be in (0, 1], got {self.gamma}")
        if self.lr <= 0:
            raise ConfigError(f"{s}.lr must be > 0, got {self.lr}")
        check_hidden(s, self.hidden)


@dataclass
class BCConfig(OfflineConfig):
    """Behaviour cloning: the policy imitates the dataset's actions (cross-entropy for
    discrete actions, squared error of the tanh-squashed action for continuous ones)."""

    section: ClassVar[str] = "bc"

    lr: float = 1e-3
    """Adam learning rate."""
    total_gradient_steps: int = 20_000
    """Gradient updates to train for (the run's budget)."""
    eval_interval: int = 2_000
    """Gradient steps between evaluations in the env."""


@dataclass
class CQLConfig(OfflineConfig):
    """Conservative Q-learning (Kumar et al. 2020, arXiv:2006.04779): SAC's losses plus a
    penalty that pushes Q down on the policy's and random actions and up on the
    dataset's (CQL(H), with the importance-sampled log-sum-exp of the authors' code)."""

    section: ClassVar[str] = "cql"

    tau: float = 0.005
    """Polyak coefficient of the target critics."""
    cql_weight: float | None = None
    """Weight of the conservative penalty (TorchRL's ``min_q_weight``, the paper's alpha).
    None: 10 for continuous actions (CORL's default; better than 5 on mixed Pendulum data)
    and 1 for Discrete ones (TorchRL's discrete default; better than 10 on 5 of 6 seeds of
    mixed CartPole data, ``benchmarks/offline_cartpole.py``)."""
    cql_temperature: float = 1.0
    """Temperature of the penalty's log-sum-exp."""
    cql_actions: int = 10
    """Actions sampled per state for the penalty, from each of: uniform on the action box,
    the policy at s, the policy at s'."""
    init_alpha: float = 1.0
    """Initial entropy temperature."""
    autotune_alpha: bool = True
    """Learn alpha so that the policy entropy tracks -action_dim."""
    deterministic_backup: bool = True
    """Leave the entropy term out of the TD target (as CORL's and TorchRL's defaults do)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 < self.tau <= 1:
            raise ConfigError(f"cql.tau must be in (0, 1], got {self.tau}")
        weight = self.penalty_weight(discrete=False)
        if weight < 0 or self.cql_temperature <= 0 or self.cql_actions <= 0:
            raise ConfigError("cql.cql_weight must be >= 0, cql.cql_temperature > 0 and "
                              f"cql.cql_actions > 0, got {self.cql_weight}, "
                              f"{self.cql_temperature}, {self.cql_actions}")
        if self.init_alpha <= 0:
            raise ConfigError(f"cql.init_alpha must be > 0, got {self.init_alpha}")


    def penalty_weight(self, discrete: bool) -> float:
        """The penalty's weight: ``cql_weight``, else the default for the action space."""
        if self.cql_weight is not None:
            return self.cql_weight
        return DISCRETE_CQL_WEIGHT if discrete else CONTINUOUS_CQL_WEIGHT


#: CQL's default penalty weights (see :attr:`CQLConfig.cql_weight`).
CONTINUOUS_CQL_WEIGHT = 10.0
DISCRETE_CQL_WEIGHT = 1.0


@dataclass
class IQLConfig(OfflineConfig):
    """Implicit Q-learning (Kostrikov et al. 2021, arXiv:2110.06169): an expectile value
    V(s) of the dataset's Q, a TD target from V(s'), and advantage-weighted regression of
    the policy on the dataset's actions; no action outside the dataset is ever queried."""

    section: ClassVar[str] = "iql"

    tau: float = 0.005
    """Polyak coefficient of the target critics."""
    expectile: float = 0.7
    """Expectile of V(s) over the dataset's Q(s, a) (0.5: the mean; towards 1: the max)."""
    temperature: float = 3.0
    """Inverse temperature beta of the policy's advantage weights exp(beta (Q - V))."""
    max_weight: float = 100.0
    """The advantage weights are clipped at this."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 < self.tau <= 1:
            raise ConfigError(f"iql.tau must be in (0, 1], got {self.tau}")
        if not 0 < self.expectile < 1:
            raise ConfigError(f"iql.expectile must be in (0, 1), got {self.expectile}")
        if self.temperature < 0 or self.max_weight <= 0:
            raise ConfigError("iql.temperature must be >= 0 and iql.max_weight > 0, got "
                              f"{self.temperature}, {self.max_weight}")


# ---------------------------------------------------------------- datasets, torch-free


def check_dataset_given(section: str, dataset: str) -> None:
    """``ConfigError`` when an offline algorithm has no dataset (the CLI checks it before
    torch is imported, the algorithm when it is built: a config without one is still a
    config, as ``rlloop presets`` prints it)."""
    if not dataset.strip():
        raise ConfigError(f"{section} learns from a dataset and none was given: pass "
                          "--dataset DIR (a directory `rlloop collect` wrote) or --dataset "
                          f"minari:ID (in the API: {section}.dataset=...)")


def check_dataset_output(output: str) -> Path:
    """``ConfigError`` unless ``output`` names a new (or empty) directory for a dataset."""
    if not output.strip():
        raise ConfigError("-o is empty; name the directory to write the dataset to, e.g. "
                          "-o data/cartpole-expert")
    path = Path(output)
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise ConfigError(f"-o {output} exists and is not an empty directory; name a new "
                          "one (a dataset is never written over another)")
    return path


def dataset_dir(name: str) -> Path:
    """The directory of dataset ``name`` (see :attr:`OfflineConfig.dataset`): the Minari
    dataset's own directory, which holds ``data/``."""
    if name.startswith(MINARI_PREFIX):
        import os

        root = os.environ.get("MINARI_DATASETS_PATH") or str(
            Path.home() / ".minari" / "datasets")
        return Path(root) / name[len(MINARI_PREFIX):]
    path = Path(name)
    return path.parent if path.name == "data" and (path / "metadata.json").is_file() else path


def dataset_metadata(name: str) -> dict[str, Any]:
    """Dataset ``name``'s Minari metadata (``data/metadata.json``), read without torch or
    Minari.

    Raises:
        ConfigError: no such directory, or not a Minari dataset.
    """
    path = dataset_dir(name)
    meta = path / "data" / "metadata.json"
    if not path.exists():
        raise ConfigError(f"dataset {name}: {path} does not exist; record one with `rlloop "
                          f"collect RUN_DIR -o {path}`, or pass the directory it was written to")
    if not meta.is_file():
        raise ConfigError(f"dataset {name}: {path} is not a Minari dataset (no "
                          "data/metadata.json); pass a directory `rlloop collect` wrote")
    try:
        data = json.loads(meta.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ConfigError(f"dataset {name}: {meta} cannot be read ({e}); record the dataset "
                          "again") from None
    if not isinstance(data, dict) or "observation_space" not in data:
        raise ConfigError(f"dataset {name}: {meta} has no observation_space; record the "
                          "dataset again")
    return data


def dataset_env_id(name: str) -> str | None:
    """The env id the dataset was recorded in, when its metadata names one."""
    spec = dataset_metadata(name).get("env_spec")
    try:
        env_id = json.loads(spec).get("id") if isinstance(spec, str) else None
    except ValueError:
        return None
    return env_id if isinstance(env_id, str) and env_id else None


def dataset_spaces(meta: dict[str, Any]) -> tuple[tuple[int, ...], str, tuple[int, ...]]:
    """A dataset's spaces from its metadata: ``(observation shape, action space type,
    action shape)``; a Discrete space's shape is ``(n,)``."""
    def space(key: str) -> dict[str, Any]:
        raw = meta.get(key)
        try:
            value = json.loads(raw) if isinstance(raw, str) else raw
        except ValueError:
            value = None
        if not isinstance(value, dict):
            raise ConfigError(f"the dataset's metadata has no readable {key}; record the "
                              "dataset again")
        return value

    obs, act = space("observation_space"), space("action_space")
    kind = str(act.get("type", "?"))
    shape = (int(act["n"]),) if kind == "Discrete" else tuple(act.get("shape", ()))
    return tuple(obs.get("shape") or ()), kind, shape


def space_mismatch(name: str, meta: dict[str, Any], env_id: str, obs_shape: tuple[int, ...],
                   action_kind: str, action_shape: tuple[int, ...]) -> str | None:
    """Why dataset ``name`` (metadata ``meta``) cannot train a policy for env ``env_id``
    (its observation shape, action space type and shape, ``(n,)`` for Discrete), or None."""
    d_obs, d_kind, d_act = dataset_spaces(meta)

    def words(obs: tuple[int, ...], kind: str, act: tuple[int, ...]) -> str:
        return (f"observations of shape {obs} and "
                f"{f'Discrete({act[0]})' if kind == 'Discrete' else f'{kind}{act}'} actions")

    if (tuple(obs_shape), action_kind, tuple(action_shape)) == (d_obs, d_kind, d_act):
        return None
    recorded = dataset_env_id(name)
    fix = (f"pass --env {recorded} (the env it was recorded in)" if recorded and
           recorded != env_id else "pass the --env the dataset was recorded in")
    return (f"dataset {name} has {words(d_obs, d_kind, d_act)}, but {env_id} has "
            f"{words(obs_shape, action_kind, action_shape)}; {fix}")
