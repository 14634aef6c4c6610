"""Trajectory rules of ``iter_samples`` / ``collect_samples`` on sync, thread and process pools.

The env's observation is ``[t, seed]`` and its episodes cycle through lengths 3, 8 and 20,
so every rule can be read off the samples: where a trajectory starts (t = 0 after a
reset), whether it is contiguous, and how it ends.
"""

from __future__ import annotations

import functools
import logging

import numpy as np
import pytest
from proc_utils import live_children
from torch import nn
from worker_envs import CountingEnv

from rlloop.envs.pool import WorkerPool
from rlloop.tasks import Sample, SamplingStats, Task, TaskConfig, iter_trajectories

ENV = functools.partial(CountingEnv, lengths=(3, 8, 20))


@pytest.fixture(scope="module", params=["sync", "thread", "process"])
def pool(request):
    before = live_children()
    with WorkerPool(ENV, 3, request.param, env_seed=0) as p:
        yield p
    assert live_children() == before  # nothing survives close()


def act(states):
    return [0] * len(states)


def collect(pool, **kwargs):
    stats = SamplingStats()
    trajectories = list(iter_trajectories(pool, act, stats=stats, **kwargs))
    return trajectories, stats


def check_contiguous(trajectory: list[Sample]) -> None:
    """One env, one episode, consecutive steps, starting fresh at t = 0."""
    ts = [int(s.obs[0]) for s in trajectory]
    assert ts == list(range(len(ts))), ts
    assert len({int(s.obs[1]) for s in trajectory}) == 1
    for s in trajectory:
        assert int(s.next_obs[0]) == int(s.obs[0]) + 1 and s.reward == 1.0
    assert all(not (s.terminated or s.truncated) for s in trajectory[:-1])
    assert trajectory[-1].terminated or trajectory[-1].truncated


def test_short_trajectories_are_discarded_with_a_warning(pool, caplog):
    with caplog.at_level(logging.WARNING, logger="rlloop.tasks.sampling"):
        trajectories, stats = collect(pool, total_samples=120, min_trajectory_length=5)
    assert trajectories and all(len(t) >= 5 for t in trajectories)
    assert stats.discarded > 0 and stats.samples == sum(len(t) for t in trajectories)
    assert "discarding a trajectory of length 3 < min_trajectory_length=5" in caplog.text
    for t in trajectories:
        check_contiguous(t)
        # Only trajectories of the final flush are cut; the others ended with the episode.
        if t[-1].terminated:
            assert len(t) in (8, 20)


def test_long_episodes_are_cut_and_the_env_reset(pool):
    trajectories, _ = collect(pool, total_samples=150, max_trajectory_length=6)
    assert all(len(t) <= 6 for t in trajectories)
    cut = [t for t in trajectories if len(t) == 6 and t[-1].truncated]
    assert cut, "no episode was long enough to be cut"
    for t in trajectories:
        check_contiguous(t)  # t = 0 first: a cut env was reset, not continued
        assert not (t[-1].terminated and t[-1].truncated)
    assert any(t[-1].terminated and len(t) == 3 for t in trajectories)


@pytest.mark.parametrize("total", [1, 50, 137])
def test_totals(pool, total):
    trajectories, stats = collect(pool, total_samples=total, max_trajectory_length=20)
    count = sum(len(t) for t in trajectories)
    assert count == stats.samples >= total
    # Overshoot comes only from trajectories that finished in the same batch.
    assert count < total + pool.num_slots * 20
    assert stats.trajectories == len(trajectories)
    for t in trajectories:
        check_contiguous(t)


def test_validation_errors_like_ml(pool):
    with pytest.raises(ValueError, match="min_trajectory_length=11 > total_samples=10"):
        iter_trajectories(pool, act, total_samples=10, min_trajectory_length=11)
    with pytest.raises(ValueError, match="min_batch_size=2 > max_batch_size=1"):
        iter_trajectories(pool, act, total_samples=10, min_batch_size=2, max_batch_size=1)


class CountingTask(Task[nn.Module]):
    """Records its hook calls; the per-trajectory hook attaches reward-to-go."""

    def __init__(self, config: TaskConfig) -> None:
        super().__init__(config)
        self.per_trajectory = 0
        self.all_trajectories: list[int] = []

    def get_environment(self):
        return ENV()

    def environment_factory(self):
        return ENV

    def get_actions(self, model, states, optimal):
        assert states.shape[1:] == (2,)
        return np.zeros(len(states), dtype=np.int64)

    def postprocess_trajectory(self, trajectory):
        self.per_trajectory += 1
        rewards = np.array([s.reward for s in trajectory])
        return [(s, float(rewards[i:].sum())) for i, s in enumerate(trajectory)]

    def postprocess_trajectories(self, trajectories):
        self.all_trajectories.append(len(trajectories))
        return trajectories

    def run_model(self, model, batch):
        raise NotImplementedError

    def compute_loss(self, model, batch, output):
        raise NotImplementedError


def test_hooks_are_called_and_clips_are_built(pool):
    task = CountingTask(TaskConfig(num_samples=4, stride=2, batch_size=8))
    trajectories = task.collect_samples(nn.Identity(), pool, 60)
    assert task.per_trajectory == len(trajectories) and task.all_trajectories == [len(trajectories)]
    assert all(len(t) >= 4 for t in trajectories)  # min length is raised to the clip size
    for t in trajectories:
        assert [ret for _, ret in t] == list(range(len(t), 0, -1))
    dataset = task.build_dataset(trajectories)
    assert len(dataset) == sum((len(t) - 4) // 2 + 1 for t in trajectories)
    batch = next(iter(task.get_dataloader(dataset)))
    sample, ret = batch
    assert sample.obs.shape == (8, 4, 2) and ret.shape == (8, 4)
    # A clip is 4 consecutive steps of one episode.
    assert ((sample.obs[:, 1:, 0] - sample.obs[:, :-1, 0]) == 1).all()
