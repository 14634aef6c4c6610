"""Dict observations (Box and Discrete entries) for PPO: one encoder per entry, learning
on MiniGrid, and the refusal of the algorithms that do not take them."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch
from mask_envs import minigrid_dict

from rlloop.config.loading import build_config
from rlloop.envs.registry import make_env
from rlloop.errors import ConfigError
from rlloop.modules.encoders import DictEncoder, NatureCNN
from rlloop.runs.build import build_algorithm

pytestmark = pytest.mark.skipif(importlib.util.find_spec("minigrid") is None,
                                reason="needs minigrid")
ENV = "rlloop-test/MiniGridDict-v0"
QUIET = ["mlflow=false", "progress=false", "save_video=false"]


def test_dict_encoder_splits_the_flat_observation_per_entry():
    parts = (("pixels", (40, 40, 3), True), ("vec", (5,), False))
    enc = DictEncoder(parts, [32, 16], "tanh")
    assert isinstance(enc.encoders[0], NatureCNN) and enc.out_dim == 512 + 16
    pixels = torch.randint(0, 256, (2, 40, 40, 3)).float()
    vec = torch.randn(2, 5)
    out = enc(torch.cat([pixels.flatten(1), vec], 1))
    torch.testing.assert_close(out[:, :512], enc.encoders[0](pixels / 255.0))
    torch.testing.assert_close(out[:, 512:], torch.tanh(enc.encoders[1](vec)))


def test_the_env_concatenates_dict_entries_in_order():
    env = make_env(ENV, 2, seed=0)
    ref = minigrid_dict()
    try:
        assert [k for k, _, _ in env.spec.obs_parts] == ["direction", "image"]
        obs = env.reset(seed=3)
        first, _ = ref.reset(seed=3)
        direction = np.eye(4, dtype=np.float32)[first["direction"]]
        expected = np.concatenate([direction, first["image"].reshape(-1).astype(np.float32)])
        np.testing.assert_array_equal(obs[0].numpy(), expected)
        for _ in range(120):  # past MiniGrid's 100-step limit: final Dict obs are stacked
            res = env.step(torch.randint(3, (2,)))
        assert res.obs.shape == res.final_obs.shape == (2, 151)
    finally:
        env.close()
        ref.close()


def test_recurrent_ppo_refuses_dict_observations():
    with pytest.raises(ConfigError, match=r"does not take Dict observations .*MiniGridDict"):
        build_algorithm(build_config("ppo", ENV, sets=[*QUIET, "ppo.recurrent=gru"]))


@pytest.mark.slow
def test_ppo_learns_minigrid_from_dict_observations():
    algo = build_algorithm(build_config(
        "ppo", ENV, flags={"seed": 0, "num_envs": 8},
        sets=[*QUIET, "ppo.rollout_steps=128", "ppo.num_epochs=4", "ppo.minibatch_size=256",
              "ppo.lr=0.001", "ppo.ent_coef=0.01"]))
    try:
        random_return = algo.evaluate(40, deterministic=False)["return_mean"]  # untrained
        steps = 0
        for _ in range(20):
            steps += int(algo.collect()["env/steps"])
            algo.update(steps)
        learned = algo.evaluate(40, deterministic=False)["return_mean"]
        assert random_return < 0.4 and learned > 0.7, (random_return, learned)
    finally:
        algo.close()
