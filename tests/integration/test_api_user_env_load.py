"""``rlloop.load()`` of a run whose env id a user's module registers says, at load, to
import that module (it failed only at the first ``predict()``, without saying so)."""

from __future__ import annotations

import gymnasium
import pytest

from rlloop import PPO, load
from rlloop.errors import EnvError

ENV_ID = "rlloop-test/NewcomerCartPole-v0"


def test_load_of_a_run_on_an_unregistered_user_env_says_to_import_its_module(tmp_path):
    gymnasium.register(ENV_ID, entry_point="gymnasium.envs.classic_control:CartPoleEnv",
                       max_episode_steps=50)
    try:
        model = PPO(ENV_ID, seed=0, run_dir=tmp_path / "run", num_envs=2, rollout_steps=16,
                    minibatch_size=32, mlflow=False, progress=False, save_video=False,
                    eval_every=0)
        model.learn(32)
        assert load(tmp_path / "run").predict([0.0, 0.0, 0.0, 0.0]).shape == ()
    finally:  # a new process, whose user module registered nothing yet
        gymnasium.registry.pop(ENV_ID)
    with pytest.raises(EnvError, match="not registered in this process: import the module "
                                       "that registers it"):
        load(tmp_path / "run")
