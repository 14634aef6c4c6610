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
}


def preset(algo: str, env_id: str) -> dict[str, Any]:
    """The preset for ``(algo, env_id)``, or an empty dict."""
    return PRESETS.get((algo, env_id), {})
