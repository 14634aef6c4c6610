"""Each algorithm's config keys, known without importing the algorithm (and torch).

The CLI checks ``--set`` keys against these before torch's second of import, so a typo
answers at once. `tests/test_cli_fast_errors.py` pins them to the config dataclasses'
fields (same names, same order): a field added there is added here too.
"""

from __future__ import annotations

from typing import Final

PPO_KEYS: Final = (
    "rollout_steps", "num_epochs", "minibatch_size", "micro_batch", "lr", "lr_schedule",
    "lr_decay_steps", "adam_eps", "gamma", "gae_lambda", "clip_coef", "vf_coef", "ent_coef",
    "clip_vf", "normalize_advantages", "target_kl", "max_grad_norm", "grad_clip_by",
    "hidden", "activation", "init_log_std", "use_sde", "sde_sample_freq", "full_std",
    "use_expln", "ortho_init", "net", "encoder", "normalize_obs", "clip_rewards",
    "normalize_rewards", "recurrent", "recurrent_hidden", "seq_len", "action_mask",
)

OFF_POLICY_KEYS: Final = (
    "buffer_size", "replay", "per_alpha", "per_beta", "per_beta_steps", "step_processor",
    "n_step", "gamma", "batch_size", "learning_starts", "opt_interval", "gradient_steps",
    "eval_interval", "record_interval", "save_interval", "max_opts", "evaluator",
    "recorder", "clip_rewards", "encoder", "compile",
)

CONFIG_KEYS: Final[dict[str, tuple[str, ...]]] = {
    "ppo": PPO_KEYS,
    "dqn": (*OFF_POLICY_KEYS, "lr", "adam_eps", "max_grad_norm", "hidden", "dueling",
            "double_q", "target_update_interval", "tau", "exploration_initial_eps",
            "exploration_final_eps", "exploration_steps", "manual_backward", "action_mask"),
    "sac": (*OFF_POLICY_KEYS, "lr", "tau", "target_update_interval", "init_alpha",
            "autotune_alpha", "target_entropy", "hidden", "use_sde", "sde_sample_freq",
            "init_log_std", "full_std", "use_expln", "use_sde_at_warmup"),
    "td3": (*OFF_POLICY_KEYS, "lr", "tau", "policy_delay", "target_policy_noise",
            "target_noise_clip", "action_noise", "action_noise_std", "ou_theta", "ou_dt",
            "hidden"),
    "ma_ppo": (*PPO_KEYS, "policy_mapping", "policies_to_train", "league_every",
               "league_size", "eval_opponent"),
}
