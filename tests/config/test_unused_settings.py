"""Settings that act only beside a switch (gSDE's knobs, OU noise's, prioritized replay's,
a schedule's length) are accepted while the switch is off, and named in one warning each
when a run starts: a tuning space may sample them across the switch, a user should hear
that they changed nothing."""

from __future__ import annotations

import logging

import pytest

from rlloop.config.loading import build_config
from rlloop.config.presets import all_files
from rlloop.config.unused_settings import unused_settings
from rlloop.runs.start import train

QUIET = ["mlflow=false", "progress=false", "save_video=false"]


@pytest.mark.parametrize(("algo", "env", "sets", "named"), [
    ("td3", "Pendulum-v1", ["td3.ou_theta=0.3"], "td3.ou_theta=0.3 has no effect while "
     "td3.action_noise is 'normal'"),
    ("td3", "Pendulum-v1", ["td3.action_noise=none", "td3.action_noise_std=0.2"],
     "td3.action_noise_std=0.2 has no effect while td3.action_noise is 'none'"),
    ("sac", "Pendulum-v1", ["sac.sde_sample_freq=4"], "sac.use_sde is False"),
    ("sac", "Pendulum-v1", ["sac.autotune_alpha=false", "sac.target_entropy=-2"],
     "sac.target_entropy=-2.0 has no effect while sac.autotune_alpha is False"),
    ("ppo", "CartPole-v1", ["ppo.sde_sample_freq=8"], "ppo.use_sde is False"),
    ("ppo", "CartPole-v1", ["ppo.seq_len=8"], "ppo.recurrent is None"),
    ("ppo", "CartPole-v1", ["ppo.lr_schedule=constant", "ppo.lr_decay_steps=1000"],
     "ppo.lr_schedule is 'constant'"),
    ("dqn", "CartPole-v1", ["dqn.per_alpha=0.7"], "dqn.replay is 'uniform'"),
])
def test_a_setting_its_switch_leaves_unused_is_named_with_the_switch(algo, env, sets, named):
    lines = unused_settings(build_config(algo, env, sets=sets).hparams)
    assert len(lines) == 1 and named in lines[0], lines
    assert "drop it or change" in lines[0]


@pytest.mark.parametrize(("algo", "sets"), [
    ("td3", ["td3.action_noise=ornstein_uhlenbeck", "td3.ou_theta=0.3"]),
    ("sac", ["sac.use_sde=true", "sac.sde_sample_freq=4"]),
    ("ppo", ["ppo.recurrent=gru", "ppo.seq_len=8"]),
    ("dqn", ["dqn.replay=prioritized", "dqn.per_alpha=0.7"]),
    ("ppo", []),
])
def test_settings_in_use_or_left_at_their_defaults_are_not_named(algo, sets):
    env = "Pendulum-v1" if algo in ("sac", "td3") else "CartPole-v1"
    assert unused_settings(build_config(algo, env, sets=sets).hparams) == []


def test_no_preset_sets_a_setting_that_does_nothing():
    for found in all_files():
        for algo in found.algorithms:
            assert unused_settings(build_config(algo, found.env).hparams) == [], (found.env, algo)


def test_a_run_warns_once_per_unused_setting_and_trains(tmp_path, caplog):
    config = build_config("td3", "Pendulum-v1", flags={"total_env_steps": 60}, sets=[
        *QUIET, "td3.ou_theta=0.3", "td3.learning_starts=20", "td3.batch_size=8",
        "td3.hidden=[8]", "num_envs=1", "eval_episodes=1"])
    with caplog.at_level(logging.WARNING, logger="rlloop.runs.session"):
        result = train(config, tmp_path / "run")
    assert result.env_steps >= 60
    assert caplog.text.count("td3.ou_theta=0.3 has no effect") == 1
