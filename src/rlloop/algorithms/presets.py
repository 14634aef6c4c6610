"""Tuned defaults per (algorithm, env), applied under the user's config.

They play the role of rl-zoo's hyperparameter files: ``rlloop train ppo --env
CartPole-v1`` should solve the task fast without flags.
"""

from __future__ import annotations

from typing import Any

PRESETS: dict[tuple[str, str], dict[str, Any]] = {
    ("ppo", "CartPole-v1"): {
        "num_envs": 16,
        "eval_episodes": 32,
        "total_env_steps": 200_000,
        "ppo": {"rollout_steps": 32, "num_epochs": 4, "minibatch_size": 256, "lr": 3e-3,
                "lr_schedule": "linear", "gamma": 0.99, "gae_lambda": 0.95, "ent_coef": 0.0},
    },
    ("ppo", "Pendulum-v1"): {
        "num_envs": 8,
        "total_env_steps": 200_000,
        "ppo": {"rollout_steps": 256, "num_epochs": 10, "minibatch_size": 256, "lr": 1e-3,
                "lr_schedule": "linear", "gamma": 0.95, "gae_lambda": 0.95, "clip_coef": 0.2,
                "ent_coef": 0.0, "normalize_obs": True, "normalize_rewards": True,
                "init_log_std": -0.5, "max_grad_norm": 0.5},
    },
    # rl-zoo's hyperparameters (hyperparams/{dqn,sac,td3}.yml), with border's cadence
    # (eval/record/save intervals count optimisation steps). SB3 updates DQN's target
    # every 10 env steps, so during a 256-step rollout it copies the online net unchanged:
    # the target is synced once per 128 updates, as here. DQN steps 4 native CartPoles
    # at once where rl-zoo steps 1: opt_interval, learning_starts and exploration count
    # transitions, so the update-to-data ratio is rl-zoo's, and one batched step of 4
    # costs about what one step of 1 does. TD3 starts learning after 1000 steps
    # (rl-zoo's earlier Pendulum entry) instead of 10000, which would leave only 10000
    # updates of the 20000-step budget.
    ("dqn", "CartPole-v1"): {
        "num_envs": 4,
        "total_env_steps": 50_000,
        "eval_episodes": 20,
        "dqn": {"lr": 2.3e-3, "batch_size": 64, "buffer_size": 100_000, "learning_starts": 1000,
                "gamma": 0.99, "opt_interval": 256, "gradient_steps": 128,
                "target_update_interval": 128, "exploration_steps": 8000,
                "exploration_final_eps": 0.04, "hidden": [256, 256],
                "eval_interval": 4, "record_interval": 1, "save_interval": 40},
    },
    ("sac", "Pendulum-v1"): {
        "num_envs": 1,
        "total_env_steps": 20_000,
        "sac": {"lr": 1e-3, "eval_interval": 1000, "record_interval": 250,
                "save_interval": 5000},
    },
    ("td3", "Pendulum-v1"): {
        "num_envs": 1,
        "total_env_steps": 20_000,
        "td3": {"lr": 1e-3, "gamma": 0.98, "buffer_size": 200_000, "learning_starts": 1000,
                "exploration_noise": 0.1, "hidden": [400, 300], "eval_interval": 1000,
                "record_interval": 250, "save_interval": 5000},
    },
    ("ma_ppo", "pettingzoo:classic.tictactoe_v3"): {
        "num_envs": 16,
        "eval_episodes": 100,
        "total_env_steps": 100_000,
        "ma_ppo": {"rollout_steps": 32, "minibatch_size": 256},
    },
}


def preset(algo: str, env_id: str) -> dict[str, Any]:
    """The preset for ``(algo, env_id)``, or an empty dict."""
    return PRESETS.get((algo, env_id), {})
