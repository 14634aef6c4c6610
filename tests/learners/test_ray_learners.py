"""Learner ranks as Ray actors (``num_learners=2`` with env runners): a real local Ray
instance of 2 CPUs for the module, real gloo groups, no mocks. The fault is injected for
real: ``ray.kill`` of the learner actor mid-training."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import torch

ray = pytest.importorskip("ray")

from learner_cases import ppo_update_case  # noqa: E402

from rlloop.algorithms.distributed import build_rank_learner  # noqa: E402
from rlloop.checkpoint import CheckpointManager, load_checkpoint  # noqa: E402
from rlloop.config.loading import build_config  # noqa: E402
from rlloop.config.ray import RayConfig  # noqa: E402
from rlloop.envs.core import Discrete, EnvSpec  # noqa: E402
from rlloop.learners.learner import DEFAULT_MODULE_ID  # noqa: E402
from rlloop.learners.learner_group import LearnerSpec, start_group  # noqa: E402
from rlloop.learners.ray_learners import NAME_PREFIX, ActorMember, RayLauncher  # noqa: E402
from rlloop.runners.ray_cluster import connect, disconnect  # noqa: E402
from rlloop.runs.start import train  # noqa: E402
from rlloop.trainers.callbacks import Callback  # noqa: E402

CPU = torch.device("cpu")
QUIET = ["mlflow=false", "progress=false", "save_video=false", "stop_on_solve=false"]


@pytest.fixture(scope="module")
def ray_instance() -> Iterator[None]:
    """A local Ray instance of 2 CPUs (one runner, one learner actor), started by rlloop's
    own code: loopback only, no dashboard."""
    started = connect(RayConfig(num_cpus=2), num_runners=1)
    assert started
    yield
    disconnect(started)


def _learner_actors() -> list[str]:
    return [n for n in ray.util.list_named_actors() if n.startswith(NAME_PREFIX)]


def _no_learner_actor_within(seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while _learner_actors() and time.monotonic() < deadline:
        time.sleep(0.1)
    return not _learner_actors()


def test_learner_rank_in_a_ray_actor_makes_one_learners_update(ray_instance: None) -> None:
    """Rank 1 is a Ray worker process; the rendezvous and gloo stay on 127.0.0.1; one update
    of 2 epochs on a batch split in two equals one in-process learner's update."""
    case = ppo_update_case()
    cfg, module, one, batch, kwargs, expected = (case.cfg, case.module, case.one, case.batch,
                                                 case.kwargs, case.expected)
    spec = LearnerSpec(build_rank_learner, cfg, EnvSpec("t", (4,), Discrete(2)), "cpu",
                       "skip", 0, 1)
    launcher = RayLauncher(num_cpus=1, num_gpus=0)
    assert launcher.host == "127.0.0.1"
    group, link, _ = start_group(spec, 2, CPU, launcher)
    assert link is not None
    two = build_rank_learner(spec, group, CPU, link, module)
    try:
        two.broadcast_state()
        [member] = link.members
        assert isinstance(member, ActorMember)
        rank1 = psutil.Process(member.pid)
        assert rank1.cmdline()[0].startswith("ray::RankActor"), rank1.cmdline()
        assert rank1.pid not in {p.pid for p in psutil.Process().children()}
        assert {c.laddr.ip.removeprefix("::ffff:")
                for c in rank1.net_connections("inet")} == {"127.0.0.1"}
        got = two.update_from_batch({DEFAULT_MODULE_ID: batch}, stop=lambda s: False,
                                    generator=torch.Generator().manual_seed(5), **kwargs)
        for k, v in one.modules.state_dict().items():
            torch.testing.assert_close(two.modules.state_dict()[k], v, atol=1e-6, rtol=0)
        for key in ("losses/policy", "losses/value", "ppo/approx_kl"):
            assert got[key] == pytest.approx(expected[key], rel=1e-5), key
        theirs = two.state_of_rank(1)["module"][DEFAULT_MODULE_ID]
        for k, v in two.get_state(components="module")["module"][DEFAULT_MODULE_ID].items():
            assert torch.equal(v, theirs[k]), k
    finally:
        two.close()
    assert member.exitcode == 0  # told to close, it ended its task; its actor is freed
    assert _no_learner_actor_within(10.0)


class _KillLearnerActor(Callback):
    """After iteration 3, ``ray.kill`` the run's learner actor, once."""

    def __init__(self) -> None:
        self.killed: list[str] = []

    def on_step(self, stats):  # type: ignore[no-untyped-def]
        if stats["algorithm/steps"] < 3 or self.killed:
            return None
        [name] = _learner_actors()
        ray.kill(ray.get_actor(name), no_restart=True)
        self.killed.append(name)
        return None


def test_killed_learner_actor_restarts_from_the_newest_checkpoint(
        ray_instance: None, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """PPO with one env runner and two learners (rank 1 a Ray actor): the actor killed
    mid-training fails the group, the run restarts it from the newest checkpoint and
    finishes; no learner actor is left."""
    cfg = build_config("ppo", "CartPole-v1", flags={"seed": 1, "total_env_steps": 1024}, sets=[
        *QUIET, "num_env_runners=1", "num_learners=2", "max_learner_restarts=1",
        "num_envs=4", "ppo.rollout_steps=32", "ppo.minibatch_size=64", "checkpoint_every=2",
        "eval_every=0", "eval_episodes=1"])
    killer = _KillLearnerActor()
    result = train(cfg, tmp_path / "run", callbacks=[killer])
    assert killer.killed, "the learner actor was never killed"
    assert "learner rank 1 (pid " in caplog.text
    assert "restarting the learners from the newest checkpoint (restart 1 of 1)" in caplog.text
    assert result.env_steps == 1024
    latest = CheckpointManager(tmp_path / "run" / "checkpoints").latest()
    assert load_checkpoint(latest).components["trainer"]["counters"]["env/steps"] == 1024
    assert _no_learner_actor_within(10.0)


_LAUNCHER_PROBE = """
import sys, torch
from rlloop.algorithms.distributed import _launcher
from rlloop.config.loading import build_config
for sets in (["num_learners=2"], ["num_learners=2", "num_env_runners=1",
                                  "ray.learner_actors=false"]):
    cfg = build_config("ppo", "CartPole-v1", sets=sets)
    assert _launcher(cfg, torch.device("cpu")) is None, sets
assert "ray" not in sys.modules, "Ray was imported"
"""


def test_learners_are_processes_without_ray() -> None:
    """Without env runners (or with ray.learner_actors=false) the ranks are spawned
    processes and Ray is never imported."""
    out = subprocess.run([sys.executable, "-c", _LAUNCHER_PROBE], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr


_SIGTERM_AFTER_CONNECT = """
import os, signal, time
from rlloop.config.ray import RayConfig
from rlloop.runners.ray_cluster import connect
connect(RayConfig(num_cpus=1), num_runners=1)
os.kill(os.getpid(), signal.SIGTERM)  # as while learner actors and runners start
time.sleep(30)
"""


def test_a_sigterm_after_starting_ray_exits_through_ray_s_python_handler() -> None:
    """ray.init set a C crash handler under its Python one: a SIGTERM while learner actors
    and runners started dumped a stack and aborted (exit code 134, at times a segfault)
    instead of exiting (Ray's Python handler: exit code 15, Ray shut down at exit)."""
    out = subprocess.run([sys.executable, "-c", _SIGTERM_AFTER_CONNECT], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 15, (out.returncode, out.stderr[-2000:])
    assert "SIGTERM received" not in out.stderr
