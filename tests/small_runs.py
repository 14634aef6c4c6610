"""Two short real training runs (PPO CartPole with observation normalisation, SAC
Pendulum) for the report, plot and export tests."""

from __future__ import annotations

from pathlib import Path

from rlloop.config.loading import build_config
from rlloop.runs.start import train

QUIET = ["mlflow=false", "progress=false", "save_video=false"]
PPO = ["ppo.normalize_obs=true", "ppo.lr=0.001", "num_envs=4", "ppo.rollout_steps=64",
       "ppo.minibatch_size=64", "eval_every=2", "eval_episodes=4"]
SAC = ["sac.hidden=[32,32]", "sac.batch_size=16", "sac.learning_starts=50",
       "sac.buffer_size=1000", "sac.record_interval=20", "sac.eval_interval=100",
       "num_envs=1", "eval_episodes=2"]


def train_ppo(run: Path, seed: int = 0, steps: int = 1024) -> Path:
    train(build_config("ppo", "CartPole-v1", flags={"seed": seed, "total_env_steps": steps},
                       sets=[*QUIET, *PPO]), run)
    return run


def train_sac(run: Path) -> Path:
    train(build_config("sac", "Pendulum-v1", flags={"total_env_steps": 250},
                       sets=[*QUIET, *SAC]), run)
    return run
