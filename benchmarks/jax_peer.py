"""SBX (Stable-Baselines in JAX, ``pip install sbx-rl``) as a benchmark contender.

SBX is optional: :func:`require_sbx` raises a one-line error naming the install when it is
missing. JAX reads its thread settings when it first starts, so :func:`one_jax_thread` must
run before anything imports ``jax``: it asks XLA's CPU client for one intra-op thread and
no multi-threaded Eigen (``XLA_FLAGS=--xla_cpu_multi_thread_eigen=false
intra_op_parallelism_threads=1``), the counterpart of ``torch.set_num_threads(1)``.

The models take rl-zoo's hyperparameters (``hyperparams/{dqn,sac,td3,ppo}.yml``), the
same values the SB3 contenders and rlloop's presets use, in SBX's units.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

#: The XLA flags that keep JAX's CPU backend on one thread.
ONE_THREAD_XLA_FLAGS = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"


class SbxMissing(RuntimeError):
    """SBX (or JAX) is not installed."""


def one_jax_thread() -> None:
    """Keep JAX's CPU backend to one thread (before ``jax`` is imported; a no-op after)."""
    flags = os.environ.get("XLA_FLAGS", "")
    if "intra_op_parallelism_threads" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} {ONE_THREAD_XLA_FLAGS}".strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")


def require_sbx() -> Any:
    """The ``sbx`` module, or :class:`SbxMissing` saying how to install it."""
    try:
        import sbx
    except ImportError as error:
        raise SbxMissing(f"SBX is not installed ({error}); install it with "
                         "`pip install sbx-rl` (brings CPU jax) to race it") from None
    return sbx


def linear(start: float) -> Callable[[float], float]:
    """rl-zoo's ``lin_<start>`` schedule: ``start`` decaying to 0 over the budget."""
    return lambda progress_remaining: progress_remaining * start


def sbx_model(algo: str, env_id: str, seed: int) -> Any:
    """SBX's ``algo`` on ``env_id`` with rl-zoo's hyperparameters (one env for the
    off-policy ones; PPO on CartPole 8 envs, as rl-zoo)."""
    sbx = require_sbx()
    import gymnasium as gym

    if algo == "dqn":
        # SBX's DQN has no gradient clipping (SB3's and rlloop's clip at norm 10).
        return sbx.DQN("MlpPolicy", gym.make(env_id), learning_rate=2.3e-3, batch_size=64,
                       buffer_size=100_000, learning_starts=1000, gamma=0.99,
                       target_update_interval=10, train_freq=256, gradient_steps=128,
                       exploration_fraction=0.16, exploration_final_eps=0.04,
                       policy_kwargs={"net_arch": [256, 256]}, seed=seed)
    if algo == "sac":
        return sbx.SAC("MlpPolicy", gym.make(env_id), learning_rate=1e-3, seed=seed)
    if algo == "td3":  # rlloop's Pendulum preset: rl-zoo's entry, learning from 1000 steps
        import numpy as np
        from stable_baselines3.common.noise import NormalActionNoise

        env = gym.make(env_id)
        n = env.action_space.shape[0]
        return sbx.TD3("MlpPolicy", env, learning_rate=1e-3, gamma=0.98, buffer_size=200_000,
                       learning_starts=1000,
                       action_noise=NormalActionNoise(np.zeros(n), 0.1 * np.ones(n)),
                       policy_kwargs={"net_arch": [400, 300]}, seed=seed)
    if algo == "ppo":
        from stable_baselines3.common.env_util import make_vec_env

        return sbx.PPO("MlpPolicy", make_vec_env(env_id, n_envs=8, seed=seed), n_steps=32,
                       batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20, ent_coef=0.0,
                       learning_rate=linear(1e-3), clip_range=linear(0.2), seed=seed)
    raise ValueError(f"no SBX contender for {algo!r}; one of dqn, sac, td3, ppo")
