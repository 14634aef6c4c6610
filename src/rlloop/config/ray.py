"""Ray settings (section ``ray``) and the checks of a run's env-runner settings, torch- and
Ray-free (connecting is `rlloop.runners.ray_cluster`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlloop.config.appo import ASYNC_ALGOS
from rlloop.errors import ConfigError

#: The algorithms whose sampling env runners can take over.
RUNNER_ALGOS = ("ppo", "dqn", "sac", "td3", "appo", "impala")


@dataclass
class RayConfig:
    """Where env runners run (section ``ray``, used only with ``num_env_runners > 0``)."""

    address: str | None = None
    """An existing cluster ("auto", "host:6379", "ray://host:10001"); None starts a local
    instance bound to 127.0.0.1 that ends with the run."""
    dashboard: bool = False
    """Start Ray's dashboard (a local instance only; it listens on 127.0.0.1:8265)."""
    num_cpus_per_runner: float = 1.0
    """CPUs each runner actor reserves on the cluster (Ray spreads the actors over nodes)."""
    num_cpus: int | None = None
    """CPUs a local instance offers (None: this machine's count, or enough for every runner
    and learner actor when that is more: a runner that waits on a slow env needs no core of
    its own)."""
    learner_actors: bool = True
    """With ``num_learners > 1``, run learner ranks 1..L-1 as Ray actors on this instance
    (false: processes spawned on this machine, as without env runners)."""
    num_cpus_per_learner: float = 1.0
    """CPUs each learner actor reserves."""
    num_gpus_per_learner: float | None = None
    """GPUs each learner actor reserves (None: 1 when ``device`` is CUDA, else 0)."""

    def __post_init__(self) -> None:
        if self.address is not None and not self.address.strip():
            raise ConfigError("ray.address is empty; pass a cluster address such as auto or "
                              "host:6379, or null for a local instance")
        if self.num_cpus is not None and self.num_cpus <= 0:
            raise ConfigError(f"ray.num_cpus must be > 0 (or null), got {self.num_cpus}")
        for name in ("num_cpus_per_runner", "num_cpus_per_learner", "num_gpus_per_learner"):
            value = getattr(self, name)
            if value is not None and not value >= 0:
                raise ConfigError(f"ray.{name} must be >= 0, got {value}")


def learner_actors(config: Any) -> int:
    """How many learner ranks of a run (a ``RunConfig``) are Ray actors: ranks 1..L-1 when
    Ray is in use (env runners; for APPO and IMPALA, only on a cluster: ``ray.address``)
    and ``ray.learner_actors`` is on, else none."""
    uses_ray = config.num_env_runners > 0 and (config.algo not in ASYNC_ALGOS
                                               or config.ray.address is not None)
    if uses_ray and config.ray.learner_actors:
        return int(config.num_learners) - 1
    return 0


def check_env_runners(config: Any) -> None:
    """ConfigError for env-runner settings (of a ``RunConfig``) that cannot work."""
    for name in ("num_env_runners", "max_weight_lag", "max_restarts"):
        if getattr(config, name) < 0:
            raise ConfigError(f"{name} must be >= 0, got {getattr(config, name)}")
    for name in ("num_envs_per_runner", "fragment_steps"):
        value = getattr(config, name)
        if value is not None and value <= 0:
            raise ConfigError(f"{name} must be > 0 (or null), got {value}")
    if not config.num_env_runners:
        return
    section = config.algo
    if getattr(config.hparams, "normalize_obs", False):
        raise ConfigError(f"{section}.normalize_obs is not supported with env runners (each "
                          f"would keep its own statistics); set {section}.normalize_obs=false "
                          "or num_env_runners=0")
    if (getattr(config.hparams, "normalize_rewards", False)
            and not hasattr(config.hparams, "rollout_steps")):
        # Off-policy rewards are scaled as they are stored, per env of this process.
        raise ConfigError(f"{section}.normalize_rewards is not supported with off-policy env "
                          f"runners; set {section}.normalize_rewards=false or "
                          "num_env_runners=0")
    if config.fragment_steps is not None and hasattr(config.hparams, "rollout_steps"):
        raise ConfigError(f"fragment_steps applies to off-policy runners; {section}'s "
                          f"fragments are {section}.rollout_steps long, set that instead")
    if section not in RUNNER_ALGOS:
        raise ConfigError(f"{section} does not support env runners (only "
                          f"{', '.join(RUNNER_ALGOS)} do); use num_env_runners=0")
    if getattr(config.hparams, "recurrent", None):
        raise ConfigError(f"{section}.recurrent is not supported with env runners (the "
                          "memory state and episode starts stay in the runners); use "
                          "num_env_runners=0")
    if getattr(config.hparams, "replay", None) == "frames" and config.num_env_runners > 1:
        raise ConfigError(f"{section}.replay=frames takes one env stream per row, which "
                          "several runners do not give; use num_env_runners=1 or "
                          f"{section}.replay=uniform")
    if getattr(config.hparams, "replay", None) == "her":
        raise ConfigError(f"{section}.replay=her keeps episodes per env of this process, which "
                          "env runners do not feed yet; use num_env_runners=0")
