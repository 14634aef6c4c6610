"""Search spaces for ``rlloop tune``: config keys (as ``--set`` takes them) and their ranges.

A space is YAML, one entry per key::

    ppo.lr: {low: 1.0e-4, high: 1.0e-2, log: true}   # a float (log-uniform)
    ppo.num_epochs: {low: 1, high: 10}               # an int: both bounds are integers
    ppo.gamma: [0.95, 0.98, 0.99, 0.995]             # a choice
    ppo.hidden: {choices: [[64, 64], [256, 256]]}    # a choice, written out

``type: float`` makes integer bounds a float range. Every algorithm has a default space
(`DEFAULT_SPACES`, after rl-zoo's samplers, narrowed to ranges that train on CartPole-sized
budgets); ``rlloop tune`` writes the space it used to ``<dir>/space.yaml``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from rlloop.config.loading import load_yaml
from rlloop.errors import ConfigError

_GAMMAS = [0.9, 0.95, 0.98, 0.99, 0.995, 0.999]
_PPO: dict[str, Any] = {
    "lr": {"low": 1e-4, "high": 1e-2, "log": True},
    "rollout_steps": [16, 32, 64, 128],
    "minibatch_size": [64, 128, 256],
    "num_epochs": [1, 4, 10],
    "gamma": _GAMMAS,
    "gae_lambda": [0.8, 0.9, 0.95, 0.98, 1.0],
    "clip_coef": [0.1, 0.2, 0.3],
    "ent_coef": {"low": 1e-8, "high": 0.1, "log": True},
    "vf_coef": {"low": 0.2, "high": 1.0},
    "max_grad_norm": [0.3, 0.5, 1.0, 5.0],
    "activation": ["tanh", "relu"],
    "hidden": {"choices": [[64, 64], [256, 256]]},
}
#: rl-zoo's A2C sampler, narrowed as PPO's is (its n_steps reach 2048).
_A2C: dict[str, Any] = {
    "lr": {"low": 1e-5, "high": 1e-2, "log": True},
    "rollout_steps": [5, 8, 16, 32],
    "gamma": _GAMMAS,
    "gae_lambda": [0.8, 0.9, 0.95, 0.98, 1.0],
    "ent_coef": {"low": 1e-8, "high": 0.1, "log": True},
    "vf_coef": {"low": 0.2, "high": 2.0},
    "max_grad_norm": [0.3, 0.5, 1.0, 5.0],
    "normalize_advantages": [False, True],
    "optimizer": ["rmsprop", "adam"],
    "activation": ["tanh", "relu"],
    "hidden": {"choices": [[64, 64], [256, 256]]},
}
_OFF_POLICY: dict[str, Any] = {
    "lr": {"low": 1e-4, "high": 3e-3, "log": True},
    "gamma": _GAMMAS,
    "batch_size": [64, 128, 256, 512],
    "learning_starts": [0, 1000, 10000],
    "opt_interval": [1, 4, 16, 64],
    "hidden": {"choices": [[64, 64], [256, 256], [400, 300]]},
}
_DQN: dict[str, Any] = {  # DQN's own knobs (keys without the section)
    "gradient_steps": [1, 4, 16, 64],
    "exploration_steps": [1000, 5000, 10000, 20000],
    "exploration_final_eps": {"low": 0.0, "high": 0.2},
    "target_update_interval": [1, 100, 1000, 10000],
}
DEFAULT_SPACES: dict[str, dict[str, Any]] = {
    "ppo": {f"ppo.{k}": v for k, v in _PPO.items()},
    "ma_ppo": {f"ma_ppo.{k}": v for k, v in _PPO.items()},
    "a2c": {f"a2c.{k}": v for k, v in _A2C.items()},
    # APPO and IMPALA: PPO's and A2C's, but for GAE's lambda (V-trace replaces GAE).
    "appo": {f"appo.{k}": v for k, v in _PPO.items() if k != "gae_lambda"},
    "impala": {f"impala.{k}": v for k, v in _A2C.items() if k != "gae_lambda"},
    "dqn": {f"dqn.{k}": v for k, v in {**_OFF_POLICY, **_DQN}.items()},
    # QR-DQN and TQC search their base algorithm's space and their quantiles.
    "qrdqn": {**{f"qrdqn.{k}": v for k, v in {**_OFF_POLICY, **_DQN}.items()},
              "qrdqn.n_quantiles": [10, 25, 50, 200]},
    "sac": {**{f"sac.{k}": v for k, v in _OFF_POLICY.items()},
            "sac.tau": [0.001, 0.005, 0.01, 0.02, 0.05]},
    "tqc": {**{f"tqc.{k}": v for k, v in _OFF_POLICY.items()},
            "tqc.tau": [0.001, 0.005, 0.01, 0.02, 0.05],
            "tqc.top_quantiles_to_drop_per_net": [0, 1, 2, 3, 5]},
    # CrossQ: SAC's space without tau (no target critics), its critics' width and delay.
    "crossq": {**{f"crossq.{k}": v for k, v in _OFF_POLICY.items()},
               "crossq.critic_hidden": {"choices": [[256, 256], [1024, 1024]]},
               "crossq.policy_delay": [1, 2, 3]},
    "td3": {**{f"td3.{k}": v for k, v in _OFF_POLICY.items()},
            "td3.tau": [0.001, 0.005, 0.01, 0.02, 0.05],
            "td3.action_noise_std": [0.1, 0.2, 0.3, 0.5],
            "td3.target_policy_noise": [0.1, 0.2, 0.3]},
    # Offline algorithms: tuned on a dataset (--set ALGO.dataset=...), evaluated in the env.
    "bc": {"bc.lr": {"low": 1e-4, "high": 3e-3, "log": True}, "bc.batch_size": [64, 256]},
    "cql": {"cql.lr": {"low": 1e-4, "high": 1e-3, "log": True},
            "cql.cql_weight": [0.5, 1.0, 5.0, 10.0]},
    "iql": {"iql.lr": {"low": 1e-4, "high": 1e-3, "log": True},
            "iql.expectile": [0.5, 0.7, 0.9], "iql.temperature": [1.0, 3.0, 10.0]},
}

_RANGE_FIELDS = frozenset({"low", "high", "log", "type"})


@dataclass(frozen=True)
class Param:
    """One searched config key: a float or int range, or a list of choices."""

    key: str
    kind: Literal["float", "int", "categorical"]
    low: float = 0.0
    high: float = 0.0
    log: bool = False
    choices: tuple[Any, ...] = ()

    def suggest(self, trial: Any) -> Any:
        """The value an Optuna trial samples for this key."""
        if self.kind == "float":
            return trial.suggest_float(self.key, self.low, self.high, log=self.log)
        if self.kind == "int":
            return trial.suggest_int(self.key, int(self.low), int(self.high), log=self.log)
        # Optuna's choices must be scalars: lists (network sizes) travel as their JSON text.
        labels = [_label(c) for c in self.choices]
        return self.choices[labels.index(trial.suggest_categorical(self.key, labels))]

    def examples(self) -> tuple[Any, ...]:
        """The values a config must accept before any trial: every choice, or both ends
        of a range (a check at one end let ``gamma: {low: 0.9, high: 1.5}`` through)."""
        if self.kind == "categorical":
            return self.choices
        if self.kind == "int":
            return int(self.low), int(self.high)
        # and a point between them that is no whole number: a float range over an int
        # setting (whole-number ends, 32.0 and 256.0) failed only in every trial
        inside = self.low + (self.high - self.low) * 0.382
        return self.low, self.high, inside if not inside.is_integer() else inside + 1e-3

    def to_data(self) -> Any:
        if self.kind == "categorical":
            return {"choices": list(self.choices)}
        low, high = (int(self.low), int(self.high)) if self.kind == "int" else (self.low, self.high)
        data: dict[str, Any] = {"low": low, "high": high, "type": self.kind}
        return {**data, "log": True} if self.log else data


def _label(choice: Any) -> Any:
    if choice is None or isinstance(choice, bool | int | float | str):
        return choice
    return json.dumps(choice)


def as_set(key: str, value: Any) -> str:
    """``--set`` text for a sampled value (JSON is YAML, so lists and floats read back)."""
    return f"{key}={json.dumps(value)}"


def default_space(algo: str) -> list[Param]:
    return parse_space(DEFAULT_SPACES[algo], f"the default {algo} space")


def load_space(path: str | Path) -> list[Param]:
    data = load_yaml(path)
    if not data:
        raise ConfigError(f"search space {path} is empty; give at least one key, e.g. "
                          "ppo.lr: {low: 1.0e-4, high: 1.0e-2, log: true}")
    return parse_space(data, f"search space {path}")


def parse_space(data: Mapping[str, Any], source: str) -> list[Param]:
    """Params of a space's plain data; ``ConfigError`` (one line naming ``source`` and the key)
    for an entry that is not a range or a list of choices."""
    return [_param(str(key), spec, f"{source}: {key}") for key, spec in data.items()]


def _param(key: str, spec: Any, where: str) -> Param:
    if isinstance(spec, Sequence) and not isinstance(spec, str):
        return _choices(key, spec, where)
    if not isinstance(spec, Mapping):
        raise ConfigError(f"{where}: expected a list of choices or a mapping with low/high "
                          f"(or choices), got {spec!r}")
    if "choices" in spec:
        if set(spec) != {"choices"}:
            extra = sorted(set(spec) - {"choices"})
            raise ConfigError(f"{where}: choices cannot be mixed with {extra}")
        choices = spec["choices"]
        if not isinstance(choices, Sequence) or isinstance(choices, str):
            raise ConfigError(f"{where}: choices must be a list, got {choices!r}")
        return _choices(key, choices, where)
    unknown = sorted(set(spec) - _RANGE_FIELDS)
    if unknown or not {"low", "high"} <= set(spec):
        raise ConfigError(f"{where}: a range takes low, high and optionally log, type (or a "
                          f"choices list); got {sorted(spec)}")
    # YAML reads 1e-4 (no dot) as a string, where a config file's float setting takes it.
    low, high = (_number(spec[k]) for k in ("low", "high"))
    log = spec.get("log", False)
    for name, value in (("low", low), ("high", high)):
        if (isinstance(value, bool) or not isinstance(value, int | float)
                or not math.isfinite(value)):
            raise ConfigError(f"{where}: {name} must be a finite number, got {value!r}")
    kind = spec.get("type") or ("int" if isinstance(low, int) and isinstance(high, int)
                                else "float")
    if kind not in ("int", "float"):
        raise ConfigError(f"{where}: type must be int or float, got {kind!r}")
    if not isinstance(log, bool):
        raise ConfigError(f"{where}: log must be true or false, got {log!r}")
    if not low < high:
        raise ConfigError(f"{where}: low must be below high, got {low} and {high}")
    if log and low <= 0:
        raise ConfigError(f"{where}: a log range needs low > 0, got {low}")
    if kind == "int" and not (float(low).is_integer() and float(high).is_integer()):
        raise ConfigError(f"{where}: an int range needs integer bounds, got {low} and {high}")
    return Param(key, "int" if kind == "int" else "float", low=float(low), high=float(high),
                 log=log)


def _number(value: Any) -> Any:
    """``value``, or the float a numeric string (``"1e-4"``) spells; anything else as is."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def _choices(key: str, choices: Sequence[Any], where: str) -> Param:
    if not choices:
        raise ConfigError(f"{where}: the list of choices is empty")
    labels = [_label(c) for c in choices]
    if len(set(map(json.dumps, labels))) != len(labels):
        raise ConfigError(f"{where}: the choices repeat a value: {list(choices)}")
    return Param(key, "categorical", choices=tuple(choices))


def space_data(space: Sequence[Param]) -> dict[str, Any]:
    """A space as the YAML it can be read back from."""
    return {p.key: p.to_data() for p in space}
