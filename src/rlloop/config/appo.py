"""APPO's and IMPALA's settings (sections ``appo`` and ``impala``): PPO's and A2C's fields,
with what asynchronous actor-learner training adds (the queue between runners and the
learner, the policy lag it accepts, V-trace's clipping), and the run-level check that such
a run has env runners. Torch-free, as every config module; :mod:`rlloop.algorithms.appo`
uses it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from rlloop.config.a2c import A2CConfig
from rlloop.config.ppo import PPOConfig
from rlloop.errors import ConfigError

#: The algorithms whose runners sample ahead into a queue while the learner learns.
ASYNC_ALGOS = ("appo", "impala")


@dataclass
class AsyncSettings:
    """What the asynchronous learner reads from the runners, shared by APPO and IMPALA."""

    section: ClassVar[str] = "async"

    max_policy_lag: int = 8
    """Updates a fragment's weights may lag the learner's and still be learned from
    (older fragments are dropped). 0: every fragment is sampled with the newest weights
    (the runners wait for each update: synchronous)."""
    queue_size: int = 2
    """Fragments the queue between the runners and the learner holds; a runner whose next
    fragment finds it full waits (so the lag stays bounded)."""
    fragments_per_batch: int = 2
    """Fragments (each rollout_steps x num_envs_per_runner steps) in one update's batch."""
    vtrace_rho_bar: float = 1.0
    """V-trace's rho-bar: the clip of the importance weights in the TD errors and the
    policy-gradient advantages (>= 1 keeps on-policy samples unweighted)."""
    vtrace_c_bar: float = 1.0
    """V-trace's c-bar: the clip of the trace-cutting weights (how far back a TD error
    reaches)."""

    def check_async(self) -> None:
        s = self.section
        if self.max_policy_lag < 0:
            raise ConfigError(f"{s}.max_policy_lag must be >= 0 (0: every fragment sampled "
                              f"with the newest weights), got {self.max_policy_lag}")
        for name in ("queue_size", "fragments_per_batch"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{s}.{name} must be >= 1, got {getattr(self, name)}; "
                                  f"set {s}.{name}=1 or more")
        for name in ("vtrace_rho_bar", "vtrace_c_bar"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{s}.{name} must be > 0 (1 is the paper's), got "
                                  f"{getattr(self, name)}")
        if getattr(self, "normalize_rewards", False):
            raise ConfigError(f"{s}.normalize_rewards is not supported (its running return "
                              f"is kept per env, and a batch holds any runner's fragments); "
                              f"set {s}.normalize_rewards=false")
        if getattr(self, "cuda_graph", False):
            raise ConfigError(f"{s}.cuda_graph captures an in-process rollout, and {s}'s "
                              f"runners sample in processes of their own; drop {s}.cuda_graph")


@dataclass
class APPOConfig(PPOConfig, AsyncSettings):
    """APPO hyperparameters: PPO's clipped surrogate on V-trace's advantages, the ratio
    taken against the weights that sampled each fragment.

    Defaults are PPO's but for the batch: two fragments of 32 steps (512 env steps with 8
    envs per runner), 4 epochs of minibatches of 128 on it, so that the learner keeps up
    with the runners."""

    section: ClassVar[str] = "appo"

    rollout_steps: int = 32
    """Env steps per env in one runner's fragment (T)."""
    num_epochs: int = 4
    """Passes over each batch."""
    minibatch_size: int = 128
    """Samples per gradient step; must not exceed a batch (fragments_per_batch x
    rollout_steps x num_envs_per_runner)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check_async()
        if self.recurrent is not None:
            raise ConfigError("appo.recurrent is not supported yet; use ppo with "
                              "ppo.recurrent, or drop appo.recurrent")

    def check_batch(self, num_envs: int) -> None:
        """None here: a batch is fragments_per_batch fragments, whatever num_envs is, and a
        minibatch larger than it is the whole batch."""


@dataclass
class IMPALAConfig(A2CConfig, AsyncSettings):
    """IMPALA hyperparameters: one RMSprop step per batch on the actor-critic loss with
    V-trace's targets and advantages (Espeholt et al., 2018), A2C's loss otherwise.

    Defaults are the paper's where they carry over (fragments of 20 steps, entropy 0.01,
    RMSprop with epsilon 0.01, gradients clipped at norm 40; its baseline cost 0.5 is 1.0
    in rlloop's units)."""

    section: ClassVar[str] = "impala"

    rollout_steps: int = 20
    """Env steps per env in one runner's fragment (T)."""
    lr: float = 6e-4
    """Learning rate (start value when lr_schedule is linear)."""
    ent_coef: float | dict[str, Any] = 0.01
    """Entropy bonus weight: a number, or a schedule on the env-step timeline."""
    optimizer_eps: float = 0.01
    """RMSprop's epsilon (the paper's 0.01)."""
    max_grad_norm: float | None = 40.0
    """Gradient clipping threshold (None: off)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check_async()


def check_async_runners(config: Any) -> None:
    """ConfigError for a run (a ``RunConfig``) of an asynchronous algorithm without env
    runners: it learns only from what runners send. (A runner's own config, which has none,
    is never checked here.)"""
    if config.algo in ASYNC_ALGOS and config.num_env_runners < 1:
        raise ConfigError(f"{config.algo} learns from env runners that sample while it "
                          f"learns, and num_env_runners is {config.num_env_runners}; set "
                          "num_env_runners=1 or more (e.g. --set num_env_runners=2)")
    if (config.algo in ASYNC_ALGOS and config.backend == "gymnasium-async"
            and config.ray.address is None):
        raise ConfigError(f"{config.algo}'s env runners are processes that may start none of "
                          "their own, as backend=gymnasium-async would; use "
                          "backend=gymnasium-thread (or gymnasium) and more env runners")


def ray_runner_settings(config: Any) -> Any:
    """The run config (a ``RunConfig``) Ray env runners read: for APPO and IMPALA on a
    cluster (``ray.address``), their ``max_policy_lag`` is the runners' ``max_weight_lag``
    (runners sample one fragment ahead each; there is no queue of ``queue_size``)."""
    if config.algo not in ASYNC_ALGOS:
        return config
    return dataclasses.replace(config, max_weight_lag=config.hparams.max_policy_lag)
