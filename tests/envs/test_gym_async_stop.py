"""The gymnasium-async backend under stop signals: a stop gives up only a wait that hangs
(an evaluation whose workers answer runs to its end, as in-process); workers killed by a
SIGTERM sent to the whole process group (a scheduler's) stop the run as a stop, not as a
broken env; and a worker found dead leaves the envs' state marked lost, so the final
checkpoint is still written."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch

from rlloop.envs.registry import make_env
from rlloop.system.signals import StopInterrupted


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


def test_workers_killed_after_a_stop_signal_stop_the_run_as_a_stop(env, monkeypatch):
    """A process group's SIGTERM killed the workers with the trainer's stop: the final
    checkpoint then failed on them and the run ended with exit 2, blaming the env, with
    no checkpoint at all under the default cadence."""
    signalled = time.monotonic()
    monkeypatch.setattr("rlloop.envs.gym_async.stop_requested_since", lambda: signalled)
    for process in env._vec.processes:
        os.kill(process.pid, signal.SIGTERM)
        process.join(5.0)
    with pytest.raises(StopInterrupted, match=r"worker \d was killed by SIGTERM.* after a stop "
                                              r"signal"):
        env.step(torch.tensor([0, 1]))
    assert list(env.get_state()) == ["lost"]


def test_a_worker_found_dead_by_the_checkpoint_marks_the_state_lost(env):
    os.kill(env._vec.processes[1].pid, signal.SIGKILL)
    env._vec.processes[1].join(5.0)
    state = env.get_state()
    assert list(state) == ["lost"] and "worker 1" in state["lost"], state
