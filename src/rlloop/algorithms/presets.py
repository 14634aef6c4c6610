"""Tuned settings per (algorithm, env), applied under the user's config.

They play the role of rl-zoo's hyperparameter files: ``rlloop train ppo --env
CartPole-v1`` should solve the task fast without flags. They are data, one YAML file per
env in ``rlloop/presets/`` (the env id with ``/`` and ``:`` written as ``-``)::

    env: CartPole-v1
    algorithms:
      ppo: {num_envs: 16, ppo: {lr: 0.003, ...}}   # a config layer, as in a --config file
    benchmark:                                    # optional: what benchmarks/zoo.py compares
      ppo: {budget: 100000, zoo_score: 500.0}

Comments in each file say where rlloop's semantics differ from rl-zoo's and how each
value was translated.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass
from importlib import resources
from typing import Any

import yaml


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
    return resources.files("rlloop") / "presets"


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
