"""Whole runs under ``torch.set_default_dtype(torch.float64)`` (issue 45, item 11): the
networks are built float64 while the envs hand out float32 observations and the replay
keeps float32 rows, so each network casts its input to its weights' dtype. Before, the
first forward pass raised "mat1 and mat2 must have the same dtype"."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import leaves

import rlloop
from rlloop.checkpoint import CheckpointManager, load_checkpoint

QUIET = {
    "mlflow": False,
    "progress": False,
    "save_video": False,
    "stop_on_solve": False,
    "eval_episodes": 1,
}
SMALL = {"learning_starts": 32, "batch_size": 16, "hidden": [16], "opt_interval": 16}
CASES = {
    "PPO": (
        "CartPole-v1",
        {"num_envs": 2, "rollout_steps": 32, "minibatch_size": 32, "num_epochs": 1},
    ),
    "DQN": ("CartPole-v1", SMALL),
    "SAC": ("Pendulum-v1", SMALL),
    "TD3": ("Pendulum-v1", SMALL),
}


@pytest.mark.parametrize("algo", sorted(CASES))
def test_a_run_trains_float64_networks_on_float32_observations(tmp_path, algo, float64_default):
    env, settings = CASES[algo]
    model = getattr(rlloop, algo)(env, seed=0, run_dir=tmp_path / "run", **QUIET, **settings)
    result = model.learn(128)
    learner = load_checkpoint(
        CheckpointManager(result.run_dir / "checkpoints").latest()
    ).components["algorithm"]["learner"]
    assert learner["weights_seq_no"] > 0  # the weights were updated
    dtypes = {v.dtype for _, v in leaves(learner["module"]) if isinstance(v, torch.Tensor)}
    assert dtypes == {torch.float64}
    obs = np.zeros(4 if env == "CartPole-v1" else 3, dtype=np.float32)
    assert np.all(np.isfinite(model.predict(obs)))
