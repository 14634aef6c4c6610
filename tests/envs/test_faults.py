"""Fault injection: envs that raise, worker processes that are SIGKILLed, envs that hang.

Each fault fires exactly once per token file (see ``worker_envs.SignEnv``), at a random
step. Training must reach its step budget and learn, ``workers/restarts`` must equal the
number of faults, and no worker process may survive. With restarts off, the trainer must
raise a typed error carrying the worker's traceback, within the step timeout.
"""

from __future__ import annotations

import functools
import time

import pytest
from proc_utils import live_children, still_alive
from sign_task import SignTask, learned, sign_policy
from worker_envs import CountingEnv, SignEnv, make_tokens, tokens_left

from rlloop.envs.pool import WorkerError, WorkerPool
from rlloop.tasks import TaskConfig, TaskTrainer
from rlloop.tasks.sampling import SamplingStats, iter_trajectories

FAULTS = 2
FAST = {"num_epoch_samples": 200, "batch_size": 50, "lr": 0.1, "total_steps": 40,
        "num_env_workers": 2}


class PoolKeepingTask(SignTask):
    """Keeps the pools it made, to check their processes afterwards."""

    pools: list[WorkerPool]

    def get_worker_pool(self, force_sync: bool = False) -> WorkerPool:
        pool = super().get_worker_pool(force_sync)
        self.pools = [*getattr(self, "pools", []), pool]
        return pool


def faulty_task(tmp_path, mode, fault, *, faults=FAULTS, **config) -> PoolKeepingTask:
    tokens = tmp_path / "tokens"
    make_tokens(tokens, faults)
    env_fn = functools.partial(SignEnv, fault=fault, token_dir=str(tokens), fault_prob=0.03,
                               hang_s=5.0 if mode == "thread" else 60.0)
    timeout = 1.0 if fault == "hang" else 60.0
    cfg = TaskConfig(**{**FAST, "env_worker_mode": mode, "step_timeout": timeout, **config})
    return PoolKeepingTask(cfg, env_fn=env_fn)


@pytest.mark.parametrize(("mode", "fault"), [
    ("process", "raise"), ("process", "kill"), ("process", "hang"),
    ("thread", "raise"), ("thread", "hang"), ("sync", "raise"),
])
def test_training_survives_faults(tmp_path, mode, fault):
    before = live_children()
    task = faulty_task(tmp_path, mode, fault)
    model = sign_policy()
    trainer = TaskTrainer(task, model)
    stats = trainer.run()
    assert tokens_left(tmp_path / "tokens") == 0, "not every fault fired; lengthen the run"
    assert trainer.state["train/steps"] == FAST["total_steps"]
    assert trainer.restarts == FAULTS and stats["workers/restarts"] == FAULTS
    assert learned(model) >= 9.0
    pids = task.pools[0].pids
    assert len(pids) == (FAST["num_env_workers"] + FAULTS if mode == "process" else 0)
    assert still_alive(pids) == [] and live_children() == before


@pytest.mark.parametrize(("fault", "kind", "text"), [
    ("raise", "raised", "RuntimeError: injected fault: the env raised"),
    ("kill", "died", "was killed by SIGKILL"),
    ("hang", "hung", "no answer within step_timeout=1.0 s"),
])
def test_without_restarts_a_typed_error_carries_the_traceback(tmp_path, fault, kind, text):
    before = live_children()
    task = faulty_task(tmp_path, "process", fault, faults=1, restart_failed_workers=False,
                       total_steps=10_000)
    start = time.monotonic()
    with pytest.raises(WorkerError) as info:
        TaskTrainer(task, sign_policy()).run()
    assert info.value.kind == kind and text in str(info.value)
    assert "restart_failed_workers is off" in str(info.value)
    if fault == "raise":
        assert "Traceback (most recent call last)" in info.value.detail
        assert "_maybe_fault" in info.value.detail  # the worker's own frames
    assert time.monotonic() - start < 30
    assert still_alive(task.pools[0].pids) == [] and live_children() == before


def test_an_env_that_always_fails_is_not_restarted_forever():
    def broken() -> CountingEnv:
        raise OSError("simulator license expired")

    pool = WorkerPool(broken, 1, "thread", max_consecutive_failures=3)
    with pytest.raises(WorkerError, match="failed 4 times in a row") as info:
        pool.next_batch()
    assert "simulator license expired" in info.value.detail and pool.restarts == 3


def test_a_worker_killed_while_idle_is_replaced(tmp_path):
    """SIGKILL from outside (OOM killer, operator) while the worker waits for an action."""
    import os
    import signal

    with WorkerPool(CountingEnv, 2, "process") as pool:
        batch = pool.next_batch(2, 2)
        os.kill(pool.pids[0], signal.SIGKILL)
        pool.send(batch, [0, 0])
        slots, restarted = set(), False
        for _ in range(10):
            batch = pool.next_batch(2, 2)
            slots |= {r.slot for r in batch}
            restarted |= any(r.restarted for r in batch)
            pool.send(batch, [0] * len(batch))
        assert pool.restarts == 1 and restarted and slots == {0, 1}
        pids = pool.pids
    assert len(pids) == 3 and still_alive(pids) == []


def test_a_trajectory_cut_by_a_restart_is_dropped_and_counted(tmp_path):
    # The fault fires on the fourth step of the first episode (the policy plants the token
    # after three calls): those three samples are dropped, the rest are whole episodes.
    tokens = tmp_path / "tokens"
    tokens.mkdir()
    env_fn = functools.partial(SignEnv, fault="raise", token_dir=str(tokens), fault_prob=1.0)
    calls = 0

    def act(states: list) -> list[int]:
        nonlocal calls
        calls += 1
        if calls == 3:
            make_tokens(tokens, 1)
        return [1] * len(states)

    stats = SamplingStats()
    with WorkerPool(env_fn, 1, "sync") as pool:
        trajectories = list(iter_trajectories(pool, act, total_samples=20, stats=stats))
    assert tokens_left(tokens) == 0 and pool.restarts == 1
    assert stats.dropped == 1
    assert [len(t) for t in trajectories] == [10, 10]
