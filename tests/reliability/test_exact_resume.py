"""Exact resume from the CLI: N steps straight == N/2, stop, new process, resume to N.

Every tensor of the final checkpoints must be bit-identical: parameters, optimiser
moments, RNG states, env state, runner state and normaliser statistics. Native envs
save their full state, so the cut may fall anywhere inside an episode.
"""

from __future__ import annotations

import subprocess

import pytest
import torch
from conftest import rlloop_cmd

from rlloop.checkpoint import CheckpointManager, load_checkpoint

CASES = {
    "ppo": ["CartPole-v1", "4096"],
    # Off-policy: the replay buffer, target networks, optimisers (SAC's alpha too), the
    # epsilon position and the cadence counters are all in the checkpoint. Gymnasium's
    # Pendulum saves its physics (unwrapped.state), so the cut may fall mid-episode.
    "dqn": ["CartPole-v1", "4096"],
    "sac": ["Pendulum-v1", "800"],
}


def _tensors(node, prefix=""):
    if isinstance(node, torch.Tensor):
        yield prefix, node
    elif isinstance(node, dict):
        for k, v in node.items():
            yield from _tensors(v, f"{prefix}/{k}")
    elif isinstance(node, list | tuple):
        for i, v in enumerate(node):
            yield from _tensors(v, f"{prefix}/{i}")


def _train(args, cwd, env):
    out = subprocess.run(rlloop_cmd("train", *args, "--quiet", "--set", "mlflow=false",
                                    "--set", "save_video=false"),
                         cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("algo", sorted(CASES))
def test_resume_is_bit_exact(tmp_path, cli_env, algo):
    env_id, steps = CASES[algo]
    half = str(int(steps) // 2)
    common = [algo, "--env", env_id, "--seed", "7", "--set", "stop_on_solve=false"]
    _train([*common, "--total-env-steps", steps, "--run-dir", "a"], tmp_path, cli_env)
    _train([*common, "--total-env-steps", half, "--run-dir", "b"], tmp_path, cli_env)
    _train([algo, "--resume", "b", "--total-env-steps", steps], tmp_path, cli_env)

    a = load_checkpoint(CheckpointManager(tmp_path / "a" / "checkpoints").latest())
    b = load_checkpoint(CheckpointManager(tmp_path / "b" / "checkpoints").latest())
    assert a.components["trainer"]["counters"] == b.components["trainer"]["counters"]
    ta = dict(_tensors({k: a.components[k] for k in ("algorithm", "rng")}))
    tb = dict(_tensors({k: b.components[k] for k in ("algorithm", "rng")}))
    assert ta.keys() == tb.keys()
    assert len(ta) > 10
    different = [k for k in ta if not torch.equal(ta[k], tb[k])]
    assert not different, different
