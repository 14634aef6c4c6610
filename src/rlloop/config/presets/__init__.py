"""Tuned settings per (algorithm, env), applied under the user's config.

They play the role of rl-zoo's hyperparameter files: ``rlloop train ppo --env
CartPole-v1`` should solve the task fast without flags. They are data, one YAML file per
env in ``rlloop/config/presets/`` (the env id with ``/`` and ``:`` written as ``-``)::

    env: CartPole-v1
    algorithms:
      ppo: {num_envs: 16, ppo: {lr: 0.003, ...}}   # a config layer, as in a --config file
    benchmark:                                    # optional: what benchmarks/zoo.py compares
      ppo: {budget: 100000, zoo_score: 500.0, zoo_std: 0.0}

``budget`` is rl-zoo's training budget in env steps, ``zoo_score``/``zoo_std`` its
published score (rl-zoo's benchmark.md). Comments in each file say where rlloop's
semantics differ from rl-zoo's and how each value was translated.

This package imports no torch: ``rlloop presets`` lists and prints presets without it.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass
from importlib import resources
from typing import Any

import yaml

from rlloop.errors import ConfigError


@dataclass(frozen=True)
class PresetFile:
    """One env's presets: a config layer per algorithm, plus benchmark metadata."""

    env: str
    algorithms: dict[str, dict[str, Any]]
    benchmark: dict[str, dict[str, Any]]


def file_name(env_id: str) -> str:
    """The preset file name for ``env_id``."""
    return env_id.replace("/", "-").replace(":", "-") + ".yaml"


def _directory() -> Any:
    return resources.files(__name__)


def _parse(text: str, name: str) -> PresetFile:
    data = yaml.safe_load(text) or {}
    if not isinstance(data, dict) or "env" not in data:
        raise ValueError(f"preset file {name} has no 'env' key")
    return PresetFile(env=str(data["env"]), algorithms=dict(data.get("algorithms") or {}),
                      benchmark=dict(data.get("benchmark") or {}))


@functools.cache
def load_file(env_id: str) -> PresetFile | None:
    """The presets for ``env_id``, or None when no file exists (read once per process)."""
    path = _directory() / file_name(env_id)
    if not path.is_file():
        return None
    found = _parse(path.read_text(encoding="utf-8"), path.name)
    return found if found.env == env_id else None


def all_files() -> list[PresetFile]:
    """Every preset file the package ships, sorted by env id."""
    files = [_parse(p.read_text(encoding="utf-8"), p.name)
             for p in _directory().iterdir() if p.name.endswith(".yaml")]
    return sorted(files, key=lambda f: f.env)


def preset(algo: str, env_id: str) -> dict[str, Any]:
    """The preset layer for ``(algo, env_id)`` (a fresh copy), or an empty dict."""
    found = load_file(env_id)
    if found is None:
        return {}
    return copy.deepcopy(found.algorithms.get(algo, {}))


@dataclass(frozen=True)
class Listed:
    """One (env, algorithm) preset as ``rlloop presets`` lists it."""

    env: str
    algo: str
    budget: int | None
    zoo_score: float | None
    zoo_std: float | None


def listing(algo: str | None = None, env_id: str | None = None) -> list[Listed]:
    """The presets, optionally only ``algo``'s and/or ``env_id``'s (ConfigError if none)."""
    rows = []
    for found in all_files():
        for name in sorted(found.algorithms):
            if algo not in (None, name) or env_id not in (None, found.env):
                continue
            bench = found.benchmark.get(name, {})
            # rl-zoo's budget of its score, else the preset's own (no score to reach); an
            # offline algorithm's counts gradient updates
            layer = found.algorithms[name]
            budget = (bench.get("budget") or layer.get("total_env_steps")
                      or (layer.get(name) or {}).get("total_gradient_steps"))
            rows.append(Listed(found.env, name, budget, bench.get("zoo_score"),
                               bench.get("zoo_std")))
    if not rows:
        what = " and ".join(x for x in (algo and f"algorithm {algo!r}",
                                         env_id and f"env {env_id!r}") if x)
        raise ConfigError(f"no presets for {what}; `rlloop presets` lists them all (an env "
                          "without a preset trains with the defaults)")
    return rows


def preset_yaml(algo: str, env_id: str) -> str:
    """The preset layer for ``(algo, env_id)`` as a YAML config file (``--config``)."""
    layer = preset(algo, env_id)
    if not layer:
        listing(algo)  # names the unknown algorithm when it has no preset anywhere
        raise ConfigError(f"no {algo} preset for {env_id}; `rlloop presets {algo}` lists the "
                          "envs that have one (others train with the defaults)")
    head = (f"# rlloop's {algo} preset for {env_id}: use with `rlloop train {algo} --config "
            f"FILE`.\n# Where each value comes from: rlloop/presets/{file_name(env_id)}.\n")
    return head + yaml.safe_dump({"env": env_id, **layer}, sort_keys=False)
