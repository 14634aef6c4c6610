"""A2C as users reach it: ``rlloop train a2c``, ``from rlloop import A2C``, export, its one
gradient step per rollout, the action spaces it acts in and what it refuses up front."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from mask_envs import register as register_masks
from pixel_envs import register

from rlloop import A2C, PPO, load
from rlloop.checkpoint import CheckpointManager, load_checkpoint
from rlloop.cli.export import export_run
from rlloop.config.loading import build_config
from rlloop.errors import ConfigError
from rlloop.learners.adam import RMSprop
from rlloop.learners.learner import DEFAULT_MODULE_ID
from rlloop.runs.build import build_algorithm

register()
register_masks()
QUIET = ["mlflow=false", "progress=false", "save_video=false"]
API_QUIET = {"save_video": False, "progress": False, "mlflow": False}


def test_rlloop_train_a2c_runs_the_cartpole_preset_and_checkpoints_rmsprop(
    tmp_path, cli_in_process
):
    out = cli_in_process(
        [
            "train",
            "a2c",
            "--env",
            "CartPole-v1",
            "--total-env-steps",
            "400",
            "--run-dir",
            str(tmp_path / "run"),
            "--quiet",
            *(x for s in QUIET for x in ("--set", s)),
        ]
    )
    assert out.returncode == 0, out.stderr
    saved = load_checkpoint(CheckpointManager(tmp_path / "run" / "checkpoints").latest())
    assert saved.components["trainer"]["counters"]["env/steps"] == 400  # 10 x (8 envs x 5)
    assert saved.components["trainer"]["counters"]["algorithm/steps"] == 10
    (optim,) = saved.components["algorithm"]["learner"]["optimizer"].values()
    assert set(optim["state"][0]) == {"step", "square_avg"}  # RMSprop's, not Adam's


def test_a2c_learns_saves_loads_and_predicts_from_python(tmp_path):
    model = A2C(
        "CartPole-v1", seed=0, run_dir=tmp_path / "run", num_envs=4, eval_every=10, **API_QUIET
    )
    assert model.learn(200).env_steps == 200  # 10 updates of 4 envs x 5 steps
    model.save(tmp_path / "copy")
    copy = A2C.load(tmp_path / "copy", device="cpu")
    obs = np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32)
    np.testing.assert_array_equal(copy.predict(obs), model.predict(obs))
    assert copy.learn(100).env_steps == 300
    exported = torch.jit.load(str(export_run(tmp_path / "run", "torchscript")))
    np.testing.assert_array_equal(exported(torch.as_tensor(obs)).numpy(), model.predict(obs))
    assert isinstance(load(tmp_path / "copy"), A2C)
    with pytest.raises(ConfigError, match=r"is a a2c run, not ppo; load it with A2C\.load"):
        PPO.load(tmp_path / "copy")


def test_one_update_is_one_rmsprop_step_on_the_whole_rollout_in_order():
    algo = build_algorithm(build_config("a2c", "CartPole-v1", flags={"num_envs": 3}, sets=QUIET))
    try:
        optimizer = algo.learner.get_optimizer(DEFAULT_MODULE_ID)
        assert isinstance(optimizer, RMSprop)
        group = optimizer.param_groups[0]
        assert (group["lr"], group["alpha"], group["eps"]) == (7e-4, 0.99, 1e-5)
        seen = []
        algo.learner.forward_train = lambda m, b: (
            seen.append(b.obs.clone()) or (algo.policy.dist_value(b.obs))
        )
        algo.collect()
        stats = algo.update(15)
        assert stats["learner/minibatch_updates"] == 1
        assert len(seen) == 1 and seen[0].shape == (15, 4)  # 5 steps x 3 envs, not shuffled
        np.testing.assert_array_equal(seen[0].numpy(), algo.buffer.obs[:].flatten(0, 1).numpy())
    finally:
        algo.close()


@pytest.mark.parametrize(
    "env_id",
    [
        "rlloop-test/TwoBandits-v0",  # MultiDiscrete actions
        "rlloop-test/BitPattern-v0",  # MultiBinary actions
        "rlloop-test/SidePixels-v0",  # pixels: a Nature CNN shared by actor and critic
        "rlloop-test/MaskedChoice-v0",  # an action mask from info
        "rlloop-test/MaskedChoiceDict-v0",  # a Dict observation and a mask
    ],
)
def test_a2c_updates_on_every_space_ppo_s_collection_takes(env_id):
    algo = build_algorithm(build_config("a2c", env_id, flags={"num_envs": 4}, sets=QUIET))
    try:
        algo.collect()
        stats = algo.update(20)
        assert np.isfinite(stats["losses/total"]) and stats["learner/minibatch_updates"] == 1
    finally:
        algo.close()


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["compile=true"], "compile: a2c has no compiled update"),
        (["num_learners=2"], r"num_learners=2 needs one of \['ppo', 'appo', 'sac'\], not a2c"),
        (["num_env_runners=1"], "a2c does not support env runners"),
        (["a2c.recurrent=lstm"], "a2c.recurrent: a2c has no recurrent policy"),
        (["a2c.num_epochs=4"], "unknown config key 'a2c.num_epochs'"),
        (["a2c.optimizer=sgd"], "a2c.optimizer"),
        (["a2c.rmsprop_alpha=1.0"], r"a2c.rmsprop_alpha must be in \[0, 1\)"),
    ],
)
def test_what_a2c_does_not_support_is_refused_when_the_config_is_built(sets, message):
    with pytest.raises(ConfigError, match=message) as caught:
        build_config("a2c", "CartPole-v1", sets=[*QUIET, *sets])
    assert "\n" not in str(caught.value)
