"""An off-policy env runner's fragment is stepped as the in-process loop steps: warm-up's
legal random actions for masked DQN, SAC's policy at warm-up with use_sde_at_warmup, TD3's
OU noise restarted where an episode ends, SAC's gSDE noise drawn anew per fragment (the
runner's rollout). Sampled here in process with the runner's own config (Ray only moves
the fragments; tests/test_ray_runners.py runs them on a real Ray instance)."""

from __future__ import annotations

import pytest
import torch
from mask_envs import MaskedChoice, register

from rlloop.config.loading import build_config
from rlloop.errors import ConfigError
from rlloop.runners.fragments import FragmentSampler
from rlloop.runners.ray_actor import runner_config
from rlloop.runs.build import build_algorithm

QUIET = ["mlflow=false", "progress=false", "save_video=false"]


def _runner_algorithm(algo: str, env: str, *sets: str):  # type: ignore[no-untyped-def]
    config = build_config(algo, env, sets=[*QUIET, "num_envs=2", "num_env_runners=1", *sets])
    return build_algorithm(runner_config(config, 0))


def test_masked_dqn_warm_up_takes_only_legal_actions():
    register()
    algorithm = _runner_algorithm("dqn", "rlloop-test/MaskedChoice-v0",
                                  "dqn.learning_starts=500")
    try:
        MaskedChoice.illegal = MaskedChoice.steps = 0
        FragmentSampler(algorithm, 100).sample(env_steps=0)  # all of it warm-up
        assert MaskedChoice.steps == 200 and MaskedChoice.illegal == 0
    finally:
        algorithm.close()


def test_ou_noise_restarts_where_a_fragment_ends_an_episode():
    algorithm = _runner_algorithm(
        "td3", "Pendulum-v1", "env_kwargs={max_episode_steps: 5}", "td3.learning_starts=0",
        "td3.action_noise=ornstein_uhlenbeck", "td3.action_noise_std=0.5")
    try:
        frag = FragmentSampler(algorithm, 10).sample(env_steps=0)
        assert frag.truncated[-1].all()  # both envs' episodes end at the fragment's end
        assert torch.count_nonzero(algorithm.noise.state) == 0
    finally:
        algorithm.close()


@pytest.mark.parametrize(("algo", "sets"), [
    ("sac", ["sac.learning_starts=0", "sac.use_sde=true"]),
    ("ppo", ["ppo.use_sde=true", "ppo.rollout_steps=8", "ppo.minibatch_size=16"]),
])
def test_gsde_noise_is_drawn_anew_for_each_fragment(algo, sets):
    algorithm = _runner_algorithm(algo, "Pendulum-v1", *sets)
    try:
        sampler = FragmentSampler(algorithm, 8)
        sampler.sample(env_steps=0)
        first = algorithm._sde_eps.clone()
        sampler.sample(env_steps=16)
        assert not torch.equal(first, algorithm._sde_eps)
        assert algorithm._sde_age == 8  # one fragment's steps since the draw
    finally:
        algorithm.close()


def test_sac_acts_with_its_policy_at_warm_up_with_use_sde_at_warmup():
    sets = ("sac.learning_starts=1000", "sac.use_sde=true")
    frags = []
    for warm in ("false", "true"):
        algorithm = _runner_algorithm("sac", "Pendulum-v1", *sets,
                                      f"sac.use_sde_at_warmup={warm}")
        try:
            frags.append(FragmentSampler(algorithm, 4).sample(env_steps=0))
        finally:
            algorithm.close()
    # Both fragments lie inside warm-up: only use_sde_at_warmup differs.
    assert frags[1].actions.abs().max() < 0.5  # the gSDE policy's small initial noise
    assert frags[0].actions.abs().max() > 0.5  # uniform over [-2, 2]


@pytest.mark.parametrize(("algo", "sets", "named"), [
    ("ppo", ["ppo.recurrent=lstm"], "ppo.recurrent is not supported with env runners"),
    ("dqn", ["dqn.replay=frames", "num_env_runners=2"], "dqn.replay=frames takes one env"),
])
def test_settings_the_runners_cannot_follow_are_refused(algo, sets, named):
    with pytest.raises(ConfigError, match=named):
        build_config(algo, "CartPole-v1", sets=[*QUIET, "num_env_runners=1", *sets])


def test_an_env_config_on_the_first_step_resets_the_env_it_builds():
    from rlloop.trainers.loop import Trainer

    config = build_config("ppo", "CartPole-v1", sets=[
        *QUIET, "backend=gymnasium", "num_envs=2", "ppo.rollout_steps=16",
        "ppo.minibatch_size=32", "horizons_per_env_reset=1"])
    algorithm = build_algorithm(config)
    try:
        stats = Trainer(algorithm).step(env_config={"max_episode_steps": 5})
        assert stats["episode/length_mean"] == 5.0
    finally:
        algorithm.close()
