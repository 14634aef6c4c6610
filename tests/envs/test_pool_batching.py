"""The batching rule of the worker pool, as the model sees it.

Workers get artificial per-step delays (worker r's env is seeded env_seed + r and picks
its delay from that seed). The model must never see fewer than ``min_batch_size`` or more
than ``max_batch_size`` states, and a straggler must never hold the others back for more
than ``max_wait_time``.
"""

from __future__ import annotations

import functools
import itertools
import time
from collections import Counter

import pytest
from proc_utils import live_children
from worker_envs import CountingEnv

from rlloop.envs.pool import WorkerPool
from rlloop.tasks.sampling import iter_trajectories

SEED = 100


class Recorder:
    """The model: records when it was called, how many states it saw and from which env."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, int]] = []
        self.steps: Counter[int] = Counter()

    def __call__(self, states: list) -> list[int]:
        self.calls.append((time.monotonic(), len(states)))
        self.steps.update(int(s[1]) - SEED for s in states)  # obs[1] is the env's seed
        return [0] * len(states)


def _run(pool: WorkerPool, recorder: Recorder, samples: int, **kwargs) -> None:
    for _ in iter_trajectories(pool, recorder, total_samples=samples, **kwargs):
        pass


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_straggler_never_delays_the_others_beyond_max_wait(mode):
    delays = {SEED + 3: 0.3}  # worker 3 is slow; the others take 5 ms a step
    env_fn = functools.partial(CountingEnv, lengths=(1000,), delay=0.005, delays=delays)
    before = live_children()
    recorder = Recorder()
    with WorkerPool(env_fn, 4, mode, env_seed=SEED) as pool:
        _run(pool, recorder, 1, min_batch_size=1, max_batch_size=4, max_wait_time=0.05)
        recorder.__init__()  # measure after the workers started
        _run(pool, recorder, 240, min_batch_size=1, max_batch_size=3, max_wait_time=0.05)
    sizes = [n for _, n in recorder.calls]
    assert min(sizes) >= 1 and max(sizes) <= 3, Counter(sizes)
    times = [t for t, _ in recorder.calls]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    # The slowest gap is one fast step plus at most max_wait (plus scheduling noise on a
    # busy 2-core machine), far below the straggler's 0.3 s step.
    assert max(gaps) < 0.2, sorted(gaps)[-5:]
    fast = [recorder.steps[r] for r in range(3)]
    assert min(fast) >= 8 * max(recorder.steps[3], 1), recorder.steps
    assert live_children() == before


def test_without_max_wait_the_straggler_sets_the_pace():
    """ml's rule with max_wait_time=None: wait until max_batch_size states are ready."""
    env_fn = functools.partial(CountingEnv, lengths=(1000,), delay=0.0,
                               delays={SEED + 2: 0.05})
    recorder = Recorder()
    with WorkerPool(env_fn, 3, "thread", env_seed=SEED) as pool:
        _run(pool, recorder, 60, min_batch_size=1, max_batch_size=None, max_wait_time=None)
    assert {n for _, n in recorder.calls} == {3}
    assert recorder.steps[0] == recorder.steps[2]


@pytest.mark.parametrize("mode", ["sync", "thread", "process"])
def test_batch_sizes_respect_min_and_max(mode):
    # Uneven delays so that workers become ready at different times.
    delays = {SEED: 0.0, SEED + 1: 0.002, SEED + 2: 0.004, SEED + 3: 0.007, SEED + 4: 0.011}
    env_fn = functools.partial(CountingEnv, lengths=(7, 3), delays=delays)
    recorder = Recorder()
    with WorkerPool(env_fn, 5, mode, env_seed=SEED) as pool:
        _run(pool, recorder, 200, min_batch_size=2, max_batch_size=3, max_wait_time=0.003)
    sizes = Counter(n for _, n in recorder.calls)
    assert set(sizes) <= {2, 3}, sizes
    if mode == "sync":  # everything is ready at once: always the maximum
        assert set(sizes) == {3}


def test_a_workers_envs_come_together():
    env_fn = functools.partial(CountingEnv, lengths=(4,), delays={SEED + 2: 0.003})
    recorder = Recorder()
    with WorkerPool(env_fn, 3, "thread", envs_per_worker=2, env_seed=SEED) as pool:
        assert pool.num_slots == 6
        _run(pool, recorder, 200, min_batch_size=1, max_batch_size=5, max_wait_time=0.0)
    sizes = {n for _, n in recorder.calls}
    assert sizes <= {2, 4}, sizes  # whole workers only, never more than 5 -> 4
    assert set(recorder.steps) == set(range(6))  # env j of worker r is seeded SEED + 2r + j


@pytest.mark.parametrize(("min_size", "max_size", "match"), [
    (3, 2, "min_batch_size=3 > max_batch_size=2"),
    (5, None, "min_batch_size=5 > max_batch_size=4"),  # max defaults to the pool's size
])
def test_min_batch_above_max_batch_is_rejected(min_size, max_size, match):
    with WorkerPool(CountingEnv, 4, "sync") as pool, pytest.raises(ValueError, match=match):
        iter_trajectories(pool, Recorder(), total_samples=10, min_batch_size=min_size,
                          max_batch_size=max_size)


def test_seeds_are_env_seed_plus_rank():
    recorder = Recorder()
    with WorkerPool(CountingEnv, 3, "thread", env_seed=SEED) as pool:
        _run(pool, recorder, 30)
    assert set(recorder.steps) == {0, 1, 2}


def test_impossible_batch_bounds_for_grouped_envs_are_rejected():
    with WorkerPool(CountingEnv, 2, "sync", envs_per_worker=2) as pool, \
            pytest.raises(ValueError, match="no multiple of envs_per_worker=2 lies in"):
        pool.next_batch(3, 3)
