"""Memory a run needs, estimated from its config before anything is allocated.

Without this, ``--num-envs 1000000000`` or ``--set ppo.hidden=[100000000]`` spend a minute
allocating (or get the process killed) before failing with an allocator traceback. Each
estimate is a lower bound (it counts only the big tensors every such run must hold), so
a refusal is certain to be right; what passes may still be too big, and then fails as
before.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import psutil

from rlloop.config.offpolicy import DQNConfig, OffPolicyConfig, SACConfig, TD3Config
from rlloop.config.on_policy import OnPolicyConfig
from rlloop.config.ppo import PPOConfig
from rlloop.config.run_config import RunConfig
from rlloop.data.obs_storage import ObsLayout
from rlloop.envs.core import Box, EnvSpec
from rlloop.envs.registry import NATIVE_ENVS
from rlloop.errors import ConfigError, suggest_lower
from rlloop.runners.env_runner import EpisodeTracker

FLOAT = 4
#: Per env, lower bounds: a native env's state tensors are a few floats per observation
#: element; a Gymnasium env object is ~6 KB (CartPole, measured); an async env is a
#: worker process with ~4 MB of private memory (measured).
GYM_ENV_BYTES = 4 * 1024
ASYNC_ENV_BYTES = 4 * 1024 * 1024
#: Per trainable parameter: the weight, its gradient and Adam's two moments.
TRAINABLE_PARAM_BYTES = 4 * FLOAT


@dataclass(frozen=True)
class Need:
    """One part of a run's memory: ``what`` it is and how to make it smaller."""

    nbytes: int
    what: str
    fix: str


def check_memory(config: RunConfig, spec: EnvSpec) -> None:
    """ConfigError naming the setting if the run's memory surely exceeds available RAM."""
    available = int(psutil.virtual_memory().available)
    needs = estimate(config, spec)
    for need in needs:
        if need.nbytes > available:
            raise ConfigError(_message(need, available))
    total = sum(n.nbytes for n in needs)
    if total > available:
        biggest = max(needs, key=lambda n: n.nbytes)
        raise ConfigError(_message(biggest, available, total))


def _message(need: Need, available: int, total: int | None = None) -> str:
    with_rest = f" ({_gib(total)} with the rest of the run)" if total else ""
    return (f"{need.what}: needs at least {_gib(need.nbytes)}{with_rest} but only "
            f"{_gib(available)} of RAM is available; {need.fix}")


def _gib(nbytes: int) -> str:
    return f"{nbytes / 2**30:,.1f} GiB"


def estimate(config: RunConfig, spec: EnvSpec) -> list[Need]:
    """The big parts of a run's memory, each a lower bound."""
    num_envs = config.num_envs
    obs = _numel(spec.obs_shape)
    obs_bytes = spec.obs_dtype.itemsize
    layout = ObsLayout.of(spec)
    # bytes of one stored observation: Dict ones per entry, their images as uint8
    stored = obs * obs_bytes if layout is None else layout.bytes_per_obs
    space = spec.action_space
    act_bytes = FLOAT * space.dim if isinstance(space, Box) else 8  # int64 indices
    needs = [_envs(config, num_envs, obs)]
    hp = config.hparams
    if isinstance(hp, OnPolicyConfig):
        steps = hp.rollout_steps * num_envs
        # obs and next obs in the env's dtype (uint8 pixels), logp, reward, flags
        per_step = 2 * stored + 2 * FLOAT + act_bytes + 2
        needs.append(Need(steps * per_step,
                          f"the rollout of {hp.section}.rollout_steps={hp.rollout_steps} x "
                          f"num_envs={num_envs} steps",
                          f"lower {hp.section}.rollout_steps or num_envs"))
    if isinstance(hp, OffPolicyConfig):
        # obs, next obs (in the env's dtype), reward, discount; the frame replay keeps
        # about one frame per transition instead of two stacks
        per_item = 2 * stored + 2 * FLOAT + act_bytes + 1
        if hp.replay == "frames" and len(spec.obs_shape) >= 2:
            per_item = (obs // spec.obs_shape[0]) * obs_bytes * 9 // 8 + 2 * FLOAT + act_bytes + 9
        key = f"{hp.section}.buffer_size"
        fits = int(psutil.virtual_memory().available) // per_item
        needs.append(Need(hp.buffer_size * per_item,
                          f"the replay buffer of {key}={hp.buffer_size:,}",
                          f"lower it, {suggest_lower(key, fits)}"))
        if hp.step_processor == "nstep" and hp.n_step > 1:
            needs.append(_nstep_window(hp, num_envs, obs * obs_bytes + act_bytes + FLOAT))
    needs += _networks(hp, obs, space.dim if isinstance(space, Box) else space.n, num_envs)
    return needs


def _envs(config: RunConfig, num_envs: int, obs: int) -> Need:
    """The envs and the runner's running episode statistics (a log of 64 steps of
    float64 return and length per env: 1 KiB per env, more than a native env's state)."""
    backend = config.backend
    if backend == "auto":
        backend = "native" if config.env in NATIVE_ENVS else "gymnasium"
    per_env = {"native": FLOAT * 3 * obs + 32,  # state, obs, final obs; counters
               "gymnasium": GYM_ENV_BYTES,
               "gymnasium-async": ASYNC_ENV_BYTES}.get(backend, 0)
    # stats_dtype: float64, float32 on MPS (which "auto" never picks)
    itemsize = FLOAT if str(config.device).split(":")[0] == "mps" else 2 * FLOAT
    stats = EpisodeTracker.nbytes(num_envs, itemsize=itemsize)
    return Need(num_envs * per_env + stats,
                f"num_envs={num_envs} ({backend} {config.env} envs and their episode "
                "statistics)", "lower num_envs")


def _nstep_window(hp: OffPolicyConfig, num_envs: int, per_step: int) -> Need:
    """The n-step processor's window: the last n_step steps (obs, action, reward) of
    every env."""
    key = f"{hp.section}.n_step"
    return Need(hp.n_step * num_envs * per_step,
                f"the n-step window of {key}={hp.n_step} x num_envs={num_envs} steps",
                f"lower {key} or num_envs")


def _mlp(in_dim: int, hidden: list[int], out_dim: int) -> int:
    return sum((a + 1) * b for a, b in itertools.pairwise([in_dim, *hidden, out_dim]))


def _networks(hp: object, obs: int, act: int, num_envs: int) -> list[Need]:
    """The parameters (with gradients and Adam state) and the activations of one training
    batch; ``act`` is the number of action outputs (Box dims or Discrete choices)."""
    if isinstance(hp, OnPolicyConfig):
        hidden = hp.hidden
        if isinstance(hp, PPOConfig):
            batch, batch_name = hp.minibatch_size, f"{hp.section}.minibatch_size"
        else:  # A2C: one step on the whole rollout
            batch, batch_name = hp.rollout_steps * num_envs, f"{hp.section}.rollout_steps"
        trainable = [_mlp(obs, hidden, act), _mlp(obs, hidden, 1)]  # actor, critic
        targets: list[int] = []
    elif isinstance(hp, DQNConfig):
        hidden, batch, batch_name = hp.hidden, hp.batch_size, f"{hp.section}.batch_size"
        # QR-DQN's head has n_quantiles outputs per action.
        trainable = [_mlp(obs, hidden, act * getattr(hp, "n_quantiles", 1))]
        targets = list(trainable)
    elif isinstance(hp, SACConfig | TD3Config):
        hidden, batch, batch_name = hp.hidden, hp.batch_size, f"{hp.section}.batch_size"
        critic = _mlp(obs + act, hidden, 1)
        actor = _mlp(obs, hidden, 2 * act if isinstance(hp, SACConfig) else act)
        trainable = [actor, critic, critic]
        targets = [critic, critic] + ([actor] if isinstance(hp, TD3Config) else [])
    else:
        return []
    section = batch_name.split(".")[0]
    params = sum(trainable)
    param_bytes = params * TRAINABLE_PARAM_BYTES + sum(targets) * FLOAT
    # Autograd keeps every hidden layer's output of each trained network for the backward pass.
    act_bytes = batch * sum(hidden) * FLOAT * len(trainable)
    return [
        Need(param_bytes, f"the networks of {section}.hidden={hidden} ({params:,} trained "
                          "parameters with gradients and Adam state)",
             f"use smaller {section}.hidden layers"),
        Need(act_bytes, f"the activations of a batch of {batch_name}={batch} through "
                        f"{section}.hidden={hidden}",
             f"lower {section}.hidden or {batch_name}"),
    ]


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
