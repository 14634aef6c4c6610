"""Settings that act only beside another one (gSDE's knobs need ``use_sde``, OU noise's
need ``action_noise: ornstein_uhlenbeck``, ...): set while that switch is off, they change
nothing. They are accepted (a tuning space may sample one across the switch) and named in
one warning each at the start of a run.

A config dataclass declares its dependencies as ``UNUSED_WHEN``: tuples of (switch field,
the switch values that leave the settings unused, the settings); and as ``REPLACED_BY``:
(a field, the settings it replaces whenever it is set, such as PPO's custom ``net``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

#: (switch, values under which the settings do nothing, settings)
Dependency = tuple[str, tuple[Any, ...], tuple[str, ...]]
#: (a field, the settings that do nothing while it is set)
Replacement = tuple[str, tuple[str, ...]]


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def unused_settings(config: Any) -> list[str]:
    """One line per setting of ``config`` changed from its default that its switch leaves
    unused, naming both and the fix."""
    rules: tuple[Dependency, ...] = getattr(config, "UNUSED_WHEN", ())
    defaults = {f.name: _default(f) for f in dataclasses.fields(config)}
    section = getattr(config, "section", "")
    lines = []
    for switch, idle, names in rules:
        value = getattr(config, switch)
        if value not in idle:
            continue
        for name in names:
            if getattr(config, name) != defaults[name]:
                lines.append(f"{section}.{name}={getattr(config, name)!r} has no effect while "
                             f"{section}.{switch} is {value!r}; drop it or change "
                             f"{section}.{switch}")
    replaced: tuple[Replacement, ...] = getattr(config, "REPLACED_BY", ())
    for field, names in replaced:
        value = getattr(config, field)
        if value is None:
            continue
        for name in names:
            if getattr(config, name) != defaults[name]:
                lines.append(f"{section}.{name}={getattr(config, name)!r} has no effect with "
                             f"{section}.{field}={value!r}, which replaces it; drop it")
    return lines


def untrained_budget(config: Any) -> str | None:
    """A line when an off-policy run's budget ends before its learning starts (a smoke run
    of a preset may mean it; a real run would end with its initial policy)."""
    starts = getattr(config.hparams, "learning_starts", None)
    if starts is None or starts < config.total_env_steps:
        return None
    section = config.hparams.section
    return (f"{section}.learning_starts={starts:,} is not below total_env_steps="
            f"{config.total_env_steps:,}: this run collects only and never trains; lower "
            f"{section}.learning_starts or raise total_env_steps")


def idle_ray_address(config: Any) -> str | None:
    """A line when ``ray.address`` is set but the run has no env runners, the part that
    runs on a cluster (several learners without runners are local processes): it would
    train locally while the user expects the cluster."""
    address = config.ray.address
    if address is None or config.num_env_runners > 0:
        return None
    return (f"ray.address={address!r} has no effect: this run has no env runners "
            "(num_env_runners=0) and collects in this machine's processes; set "
            "num_env_runners to use the cluster, or drop ray.address")


def rounded_budget(config: Any) -> str | None:
    """A line when PPO's budget, rounded up to whole iterations, is well above the one
    asked for (a smoke run of a preset with 16 envs x 1,024 steps trains 16,384 steps)."""
    steps = getattr(config.hparams, "rollout_steps", None)
    if steps is None or config.num_env_runners > 0:
        return None
    iteration = config.num_envs * steps
    trained = -(-config.total_env_steps // iteration) * iteration
    if trained < 1.5 * config.total_env_steps:
        return None
    section = config.hparams.section
    return (f"total_env_steps={config.total_env_steps:,} rounds up to whole iterations of "
            f"num_envs x {section}.rollout_steps = {iteration:,} env steps: this run trains "
            f"{trained:,}; lower num_envs or {section}.rollout_steps for a shorter run")


def run_warnings(config: Any) -> list[str]:
    """The run-level lines of a config that trains, but not as its settings suggest."""
    return [line for line in (untrained_budget(config), idle_ray_address(config),
                              rounded_budget(config)) if line is not None]
