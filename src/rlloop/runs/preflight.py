"""Before a run writes anything: its config checked against the run directory, the machine
and the env, so that what would fail later fails now, in one line."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from rlloop.algorithms.base import EnvSettings
from rlloop.config.registry import action_space_refusal
from rlloop.config.run_config import RunConfig
from rlloop.config.unused_settings import unused_settings
from rlloop.envs.core import EnvSpec
from rlloop.envs.registry import env_spec
from rlloop.errors import ConfigError
from rlloop.runs.memory import check_memory
from rlloop.system.devices import check_cpu_compiler, keep_freed_host_memory, resolve_device
from rlloop.system.run_files import check_members

_log = logging.getLogger(__name__)


def check_run(config: RunConfig, run_dir: Path) -> EnvSettings:
    """Refuse a run directory with a planted link, an MLflow store MLflow would refuse, and a
    config the env, the device or the memory cannot take; warn about settings the run does
    not use. Returns the env's settings the algorithm is built for."""
    check_members(run_dir)
    check_tracking_store(config)
    for line in unused_settings(config.hparams):
        _log.warning(line)
    return check_fit(config)


def check_tracking_store(config: RunConfig) -> None:
    """Refuse, before training, an MLflow store that MLflow would refuse after it."""
    if config.mlflow and config.mlflow_tracking_uri:
        from rlloop.logging.mlflow_store import (
            file_store_refusal,
            sqlite_store_refusal,
            unknown_scheme_refusal,
        )

        uri = config.mlflow_tracking_uri
        reason = (unknown_scheme_refusal(uri) or file_store_refusal(uri)
                  or sqlite_store_refusal(uri))
        if reason is not None:
            raise ConfigError(reason)


def check_fit(config: RunConfig) -> EnvSettings:
    """Whether ``config`` can train here: the algorithm fits the env's action space, the
    batch its env count, the device, compiler and memory are there; the env settings the
    algorithm is built with. Checks that need no env run first, so bad sizes fail before
    any env is created, and settings whose memory cannot fit fail before anything is
    allocated. ``ConfigError`` names the problem and the fix.
    """
    keep_freed_host_memory()
    world = os.environ.get("WORLD_SIZE", "")
    if config.num_learners == 1 and world.isdigit() and int(world) > 1 and "RANK" in os.environ:
        raise ConfigError(f"the launcher started {world} processes (WORLD_SIZE) but "
                          "num_learners=1, so each would train the whole run alone in the "
                          f"same run directory; set num_learners={world}")
    if getattr(config.hparams, "cuda_graph", False) and config.num_env_runners:
        raise ConfigError(f"{config.algo}.cuda_graph captures the rollout this process "
                          "collects, and env runners collect it elsewhere; set "
                          f"num_env_runners=0 or drop {config.algo}.cuda_graph")
    # With env runners the batch holds every runner's envs: num_env_runners x M.
    num_envs = config.num_envs
    if config.num_env_runners:
        from rlloop.runners.ray_actor import envs_per_runner

        num_envs = config.num_env_runners * envs_per_runner(config)
    check = getattr(config.hparams, "check_batch", None)
    if check is not None:
        check(num_envs)
    spec = check_action_space(config)
    device = resolve_device(config.device)
    if getattr(config.hparams, "compile", False) and device.type == "cpu":
        check_cpu_compiler(config.algo)
    check_memory(config, spec)
    return EnvSettings(config.env, spec, num_envs, config.backend, config.seed,
                       config.total_env_steps, config.horizons_per_env_reset,
                       dict(config.env_kwargs), config.on_nonfinite, device,
                       step_timeout=config.step_timeout)


def check_action_space(config: RunConfig) -> EnvSpec:
    """The env's spec, or ``ConfigError`` when the algorithm cannot act in its action
    space (naming the algorithms that can)."""
    spec = env_spec(config.env, config.backend, env_kwargs=config.env_kwargs)
    refusal = action_space_refusal(config.algo, config.env, type(spec.action_space).__name__)
    if refusal is not None:
        raise ConfigError(refusal)
    return spec
