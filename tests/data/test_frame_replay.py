"""The frame replay: each frame stored once, stacks read back bit-identical, exact resume."""

from __future__ import annotations

import dataclasses
import math
import subprocess
from pathlib import Path

import pytest
import torch
from conftest import leaves, rlloop_cmd, same_leaf
from pixel_envs import register

from rlloop.checkpoint import CheckpointManager, load_checkpoint
from rlloop.config.loading import build_config
from rlloop.data.frame_replay import FrameReplayBuffer
from rlloop.data.transitions import Transitions
from rlloop.errors import ConfigError
from rlloop.runs.build import build_algorithm

register()
TESTS = Path(__file__).parents[1]
STACK, SIDE = 4, 6


def _episodes(num_envs: int, steps: int, seed: int = 0):
    """Frame-stacked transitions of episodes of random lengths (1 to 7 steps), with a
    unique reward per transition to identify it; yields ``(Transitions, ids)`` per step."""
    g = torch.Generator().manual_seed(seed)

    def new_frame():
        return torch.randint(0, 256, (SIDE, SIDE), generator=g, dtype=torch.uint8)

    def reset():
        return new_frame()[None].repeat(STACK, 1, 1)

    obs = [reset() for _ in range(num_envs)]
    left = [int(torch.randint(1, 8, (1,), generator=g)) for _ in range(num_envs)]
    uid = 0
    for _ in range(steps):
        rows, nexts, ends = [], [], []
        for e in range(num_envs):
            nxt = torch.cat([obs[e][1:], new_frame()[None]])
            left[e] -= 1
            rows.append(obs[e])
            nexts.append(nxt)
            ends.append(left[e] == 0)
            if left[e] == 0:
                nxt_start, left[e] = reset(), int(torch.randint(1, 8, (1,), generator=g))
                obs[e] = nxt_start
            else:
                obs[e] = nxt
        n = num_envs
        reward = torch.arange(uid, uid + n, dtype=torch.float32)
        uid += n
        yield Transitions(torch.stack(rows), torch.zeros(n, dtype=torch.int64), reward,
                          torch.stack(nexts), torch.tensor(ends), torch.full((n,), 0.99))


def test_stacks_come_back_bit_identical_and_only_the_newest_stay():
    replay = FrameReplayBuffer(64, (STACK, SIDE, SIDE), 2, (), torch.int64)
    added = {}
    for t in _episodes(2, 200):
        replay.add(t)
        for i in range(2):
            added[float(t.reward[i])] = (t.obs[i], t.next_obs[i], bool(t.terminated[i]))
    # Episodes of 4 steps on average write 4 extra frames each: the ring of frames fills
    # before the 64 transition slots do, and the oldest transitions leave early.
    assert 40 <= len(replay) <= 64
    batch = replay.sample(4000, torch.Generator().manual_seed(1))
    ids = batch.reward.tolist()
    assert min(ids) >= 400 - 64  # only the newest transitions are kept
    assert len(set(ids)) > 40
    for k, uid in enumerate(ids):
        obs, nxt, ended = added[uid]
        assert torch.equal(batch.obs[k], obs) and torch.equal(batch.next_obs[k], nxt)
        assert bool(batch.terminated[k]) == ended


def test_frames_are_stored_about_once():
    replay = FrameReplayBuffer(100_000, (4, 84, 84), 1, (), torch.int64)
    naive = 100_000 * 2 * 4 * 84 * 84  # obs and next_obs stacks per transition
    assert replay.nbytes < naive / 7
    assert replay.frames.shape == (1, replay.frames_per_env, 84, 84)
    assert replay.frames_per_env < 100_000 * 1.13


def test_state_round_trip_samples_the_same():
    a = FrameReplayBuffer(40, (STACK, SIDE, SIDE), 2, (), torch.int64)
    b = FrameReplayBuffer(40, (STACK, SIDE, SIDE), 2, (), torch.int64)
    steps = list(_episodes(2, 90))
    for t in steps[:60]:
        a.add(t)
    b.set_state({k: v.clone() if isinstance(v, torch.Tensor) else v
                 for k, v in a.get_state().items()})
    for t in steps[60:]:
        a.add(t)
        b.add(t)
    sa, sb = (dataclasses.astuple(r.sample(256, torch.Generator().manual_seed(3)))
              for r in (a, b))
    assert all(torch.equal(x, y) for x, y in zip(sa, sb, strict=True) if x is not None)


def test_frame_replay_refuses_vector_observations_and_n_step():
    with pytest.raises(ConfigError, match=r"dqn.replay=frames needs stacked uint8 frames .* "
                                          r"use dqn.replay=uniform"):
        build_algorithm(build_config("dqn", "CartPole-v1",
                                     sets=["mlflow=false", "dqn.replay=frames"]))
    with pytest.raises(ConfigError, match=r"set dqn.n_step=1 or dqn.replay=uniform"):
        build_algorithm(build_config("dqn", "rlloop-test/StackedSide-v0", sets=[
            "mlflow=false", "dqn.replay=frames", "dqn.n_step=3"]))


def _train(cwd: Path, *args: str) -> None:
    out = subprocess.run(rlloop_cmd("train", *args), cwd=cwd, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr


@pytest.mark.slow
def test_dqn_with_the_frame_replay_resumes_bit_exactly(tmp_path, cli_in_process):
    # Cut mid-episode: the env's whole state (its frame stack) is in the checkpoint. A
    # record at every optimisation step, so the cut falls on a record boundary too. The
    # straight and the cut run train in this process (the tests' folder, where the env's
    # module is, is on its path), the resume in a new one.
    env = "pixel_envs:rlloop-test/StackedSide-v0"
    common = ["dqn", "--env", env, "--seed", "3", "--set", "stop_on_solve=false",
              "--set", "dqn.replay=frames", "--set", "dqn.learning_starts=200",
              "--set", "dqn.buffer_size=500", "--set", "dqn.eval_interval=1000",
              "--set", "dqn.record_interval=1",
              "--set", "mlflow=false", "--set", "save_video=false", "--quiet"]
    cwd = TESTS
    for steps, run in (("600", "a"), ("303", "b")):
        out = cli_in_process(["train", *common, "--total-env-steps", steps, "--run-dir",
                              str(tmp_path / run)])
        assert out.returncode == 0, out.stderr
    _train(cwd, "dqn", "--resume", str(tmp_path / "b"), "--total-env-steps", "600",
           "--allow-import")
    a = load_checkpoint(CheckpointManager(tmp_path / "a" / "checkpoints").latest())
    b = load_checkpoint(CheckpointManager(tmp_path / "b" / "checkpoints").latest())
    la = dict(leaves({k: a.components[k] for k in ("algorithm", "rng")}))
    lb = dict(leaves({k: b.components[k] for k in ("algorithm", "rng")}))
    assert la.keys() == lb.keys()
    assert any("frames" in k for k in la)
    # The learner's logged-lr accumulator is folded at a checkpoint, so its float sum is
    # added up in another order after a cut (a logging statistic, not training state):
    # equal to rounding there, bit-identical everywhere else.
    different = [k for k in la if not (same_leaf(la[k], lb[k]) or (
        "metrics_logger" in k and math.isclose(la[k], lb[k], rel_tol=1e-12)))]
    assert not different, different
