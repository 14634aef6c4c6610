"""Config layering and typed errors for bad input."""

import gymnasium
import numpy as np
import pytest

from rlloop.config import build_config, from_dict
from rlloop.errors import ConfigError
from rlloop.run import build_algorithm


def test_layers_preset_file_flags_sets(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("num_envs: 4\nppo:\n  lr: 0.01\n  rollout_steps: 64\n")
    cfg = build_config("ppo", "CartPole-v1", file=f, flags={"num_envs": 8},
                       sets=["ppo.lr=0.5", "stop_on_solve=false"])
    assert cfg.num_envs == 8 and cfg.hparams.lr == 0.5 and cfg.hparams.rollout_steps == 64
    assert cfg.stop_on_solve is False
    assert cfg.hparams.num_epochs == 4  # from the CartPole preset


def test_roundtrip_through_dict():
    cfg = build_config("ppo", "Pendulum-v1")
    again = from_dict(cfg.to_dict())
    assert again == cfg


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["ppo.lr=abc"], "ppo.lr must be a number"),
        (["ppo.lrr=0.1"], "did you mean ppo.lr"),
        (["bogus=1"], "unknown config key 'bogus'"),
        (["num_envs=0"], "num_envs must be > 0"),
        (["num_envs=2.5"], "num_envs must be an integer"),
        (["stop_on_solve=maybe"], "stop_on_solve must be true or false"),
        (["backend=cuda"], "unknown backend"),
        (["ppo.activation=gelu"], "ppo.activation must be one of"),
        (["ppo.minibatch_size=-1"], "ppo.minibatch_size must be > 0"),
        (["horizons_per_env_reset=0"], "horizons_per_env_reset must be"),
        (["ppo.hidden=[]"], "ppo.hidden must be a non-empty list"),
        (["noequals"], "--set expects key=value"),
    ],
)
def test_bad_values_raise_config_error(sets, message):
    with pytest.raises(ConfigError, match=message):
        build_config("ppo", "CartPole-v1", sets=sets)


def test_unknown_algorithm():
    with pytest.raises(ConfigError, match="unknown algorithm 'a2c'; choose one of"):
        build_config("a2c", "CartPole-v1")


def test_bad_yaml_file(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("a: [1,\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        build_config("ppo", file=f)
    with pytest.raises(ConfigError, match="does not exist"):
        build_config("ppo", file=tmp_path / "missing.yaml")


class _Pixels(gymnasium.Env):  # type: ignore[type-arg]
    action_space = gymnasium.spaces.Discrete(2)

    def __init__(self, shape: tuple[int, ...] = (12, 10, 3)) -> None:
        self.observation_space = gymnasium.spaces.Box(0, 255, shape, np.uint8)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), 1.0, False, False, {}


@pytest.mark.parametrize("shape", [(12, 10, 3), (3, 12, 10), (12, 10)])
def test_image_observations_are_refused_before_an_mlp_sees_them(shape):
    env_id = f"rlloop-test/Pixels{len(shape)}{shape[0]}-v0"
    gymnasium.register(env_id, entry_point=_Pixels, kwargs={"shape": shape})
    for algo in ("dqn", "ppo"):
        with pytest.raises(ConfigError, match=r"image observations \(uint8 .* MLPs only.*"
                                              r"--set env_kwargs.obs_type=ram"):
            build_algorithm(build_config(algo, env_id, sets=["mlflow=false"]))


def test_byte_vectors_are_not_images():
    # Atari's RAM observations are 128 uint8 values: a vector an MLP can take.
    gymnasium.register("rlloop-test/Ram-v0", entry_point=_Pixels, kwargs={"shape": (128,)},
                       max_episode_steps=10)
    algo = build_algorithm(build_config("dqn", "rlloop-test/Ram-v0", sets=["mlflow=false"]))
    assert algo.settings.spec.obs_shape == (128,)
    algo.close()
