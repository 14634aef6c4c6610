"""The gymnasium-async backend under stop signals: a stop gives up only a wait that hangs
(an evaluation whose workers answer runs to its end, as in-process), and workers outlive a
SIGTERM sent to the whole process group, so the trainer's final checkpoint can still ask
them for their state; a worker that died anyway leaves that state marked lost."""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest
import torch

from rlloop.envs.registry import make_env


@pytest.fixture
def env():
    env = make_env("CartPole-v1", 2, backend="gymnasium-async", seed=0)
    env.reset()
    yield env
    env.close()


def test_a_stop_signal_lets_answering_workers_finish(env, monkeypatch):
    """Every wait gave up 3 s after the signal, even one answered at once: a SIGTERM
    during a long evaluation dropped the evaluation, and the resumed run never ran it."""
    signalled = time.monotonic() - 10.0  # a stop asked 10 s ago
    monkeypatch.setattr("rlloop.envs.gym_async.stop_requested_since", lambda: signalled)
    for _ in range(20):
        env.step(torch.tensor([0, 1]))


def test_workers_outlive_a_sigterm_and_answer_for_the_checkpoint(env):
    """A process group's SIGTERM killed the workers; the final checkpoint then failed on
    them and the run ended with exit 2, blaming the env, with no checkpoint."""
    os.kill(env._vec.processes[1].pid, signal.SIGTERM)
    time.sleep(0.3)
    assert all(p.is_alive() for p in env._vec.processes)
    assert "env_rngs" in env.get_state()
    env.step(torch.tensor([0, 1]))


def test_a_worker_found_dead_by_the_checkpoint_marks_the_state_lost(env):
    os.kill(env._vec.processes[1].pid, signal.SIGKILL)
    env._vec.processes[1].join(5.0)
    state = env.get_state()
    assert list(state) == ["lost"] and "worker 1" in state["lost"], state


def test_the_forkserver_outlives_a_sigterm_and_the_workers_with_it(env):
    """The workers' parent is multiprocessing's forkserver: a process group's SIGTERM killed
    it, and the workers died with it (their parent-death signal)."""
    worker = psutil.Process(env._vec.processes[0].pid)
    forkserver = worker.parent()
    assert forkserver is not None and forkserver.pid != os.getpid()
    os.kill(forkserver.pid, signal.SIGTERM)
    time.sleep(0.3)
    assert forkserver.is_running() and forkserver.status() != psutil.STATUS_ZOMBIE
    env.step(torch.tensor([0, 1]))
    assert "env_rngs" in env.get_state()
