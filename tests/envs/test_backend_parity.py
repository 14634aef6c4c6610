"""The Gymnasium backends agree where a review found them apart: info masks given as
lists, MountainCar-v0's tuple state in checkpoints, a resume after lost async workers,
and the global RNGs of async workers."""

from __future__ import annotations

import backend_envs  # noqa: F401  (registers the envs below)
import numpy as np
import pytest
import torch

from rlloop.envs import make_env

LIST_MASK = "backend_envs:rlloop-test/ListMask-v0"


@pytest.mark.parametrize("backend", ["gymnasium", "gymnasium-thread", "gymnasium-async"])
def test_info_masks_given_as_lists_work_on_every_backend(backend):
    env = make_env(LIST_MASK, 2, backend=backend, seed=0)
    try:
        obs = env.reset()
        assert env.spec.action_mask == 4 and obs.shape == (2, 6)
        for _ in range(7):  # across an episode end
            obs = env.step(torch.zeros(2, dtype=torch.long)).obs
        assert (obs[:, 2] == 1).all() and set(obs[:, 3:].flatten().tolist()) <= {0.0, 1.0}
    finally:
        env.close()


def test_mountain_car_episodes_continue_across_a_resume():
    """MountainCar-v0 keeps its state as a tuple after a step: it was not saved, so every
    resume cut its episodes."""
    env = make_env("MountainCar-v0", 2, backend="gymnasium", seed=3)
    push = torch.tensor([2, 0])
    try:
        env.reset()
        for _ in range(7):
            env.step(push)
        state = env.get_state()
        expected = env.step(push).obs
    finally:
        env.close()
    again = make_env("MountainCar-v0", 2, backend="gymnasium", seed=3)
    try:
        again.reset()
        again.set_state(state)
        assert again.state_restored
        assert torch.equal(again.step(push).obs, expected)
    finally:
        again.close()


def test_a_resume_after_lost_workers_does_not_replay_the_first_episodes():
    env = make_env("CartPole-v1", 2, backend="gymnasium", seed=5)
    try:
        first = env.reset()  # the seeds of the run's first episodes (seed + i)
    finally:
        env.close()
    resumed = make_env("CartPole-v1", 2, backend="gymnasium", seed=5)
    try:
        resumed.set_state({"lost": "env worker 1 died"})
        assert not resumed.state_restored
        again = resumed.reset()
        assert not torch.equal(again, first)
        assert torch.equal(again, _reset_after_loss())  # and it is reproducible
    finally:
        resumed.close()


def _reset_after_loss() -> torch.Tensor:
    env = make_env("CartPole-v1", 2, backend="gymnasium", seed=5)
    try:
        env.set_state({"lost": "again"})
        return env.reset()
    finally:
        env.close()


def test_async_workers_seed_their_global_rngs():
    """An env drawing from np.random in an async worker (a fresh process each run) gave
    other numbers on every run; the worker's global RNGs are seeded with its env."""
    runs = []
    for _ in range(2):
        env = make_env("backend_envs:rlloop-test/GlobalRng-v0", 2, backend="gymnasium-async",
                       seed=11)
        try:
            obs = [env.reset()]
            obs += [env.step(torch.zeros(2, dtype=torch.long)).obs for _ in range(6)]
            runs.append(torch.stack(obs))
        finally:
            env.close()
    assert torch.equal(runs[0], runs[1])
    assert not np.allclose(runs[0][:, 0].numpy(), runs[0][:, 1].numpy())  # own streams
