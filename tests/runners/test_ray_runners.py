"""Env runners on a real local Ray instance: one instance for the whole module (starting
Ray takes seconds), two CPUs, no mocks. Faults are injected for real: ``ray.kill`` of a
runner mid-fragment, an env that raises inside a runner."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch

ray = pytest.importorskip("ray")

import runner_envs  # noqa: E402  (registers SlowFromSeed-v0 and HomeOnly-v0)
from cli_runs import QUIET, failed_runner_error  # noqa: E402
from ray.exceptions import GetTimeoutError, RayActorError  # noqa: E402

import rlloop.envs.slow  # noqa: E402, F401  (registers SlowCartPole-v1, as --env would)
from rlloop.config.loading import build_config  # noqa: E402
from rlloop.config.ray import RayConfig  # noqa: E402
from rlloop.config.run_config import RunConfig  # noqa: E402
from rlloop.errors import ConfigError  # noqa: E402
from rlloop.runners.fragments import FragmentSampler  # noqa: E402
from rlloop.runners.ray_actor import runner_config  # noqa: E402
from rlloop.runners.ray_cluster import connect, disconnect  # noqa: E402
from rlloop.runs.build import build_algorithm  # noqa: E402
from rlloop.runs.session import Session  # noqa: E402
from rlloop.trainers.loop import Trainer  # noqa: E402

TESTS = Path(__file__).resolve().parents[1]
SLOW_ENV = "rlloop.envs.slow:SlowCartPole-v1"


@pytest.fixture(scope="module")
def ray_instance() -> Iterator[None]:
    """A local Ray instance of 2 CPUs, started by rlloop's own code (loopback only, no
    dashboard); runners can import the tests' env modules, and this module (a network
    defined here reaches them by reference)."""
    path = os.environ.get("PYTHONPATH", "")
    here = str(Path(__file__).resolve().parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS), here, path) if p)
    try:
        started = connect(RayConfig(num_cpus=2), num_runners=2)
    finally:
        os.environ["PYTHONPATH"] = path
    assert started
    yield
    disconnect(started)


def config(*sets: str, algo: str = "ppo", env: str = "CartPole-v1") -> RunConfig:
    return build_config(algo, env, sets=[*QUIET, *sets])


def test_ray_listens_on_loopback_only(ray_instance: None) -> None:
    procs = [psutil.Process(), *psutil.Process().children(recursive=True)]
    pids = {p.pid for p in procs}
    listening = [c for c in psutil.net_connections("inet")
                 if c.status == psutil.CONN_LISTEN and c.pid in pids]
    assert listening, "found no listening socket of Ray's processes"
    public = [c.laddr for c in listening
              if c.laddr.ip not in ("127.0.0.1", "::1", "::ffff:127.0.0.1")]
    assert not public, f"Ray listens on a public interface: {public}"


def test_runners_sample_like_in_process_with_the_learners_weights(ray_instance: None) -> None:
    """2 runners x 2 envs give the rollout 4 in-process envs give; every fragment was
    sampled with the learner's newest weights (max_weight_lag=0), whose number advances."""
    base = config("num_envs=4", "ppo.rollout_steps=16", "ppo.minibatch_size=32")
    local = build_algorithm(base)
    remote = build_algorithm(dataclasses.replace(base, num_env_runners=2, max_weight_lag=0))
    try:
        group: Any = remote.runner
        for it in range(3):
            seq = remote.learner.weights_seq_no
            assert seq == it
            steps = local.collect()["env/steps"], remote.collect()["env/steps"]
            assert steps == (64.0, 64.0)
            assert remote.buffer.rewards.shape == local.buffer.rewards.shape == (16, 4)
            assert remote.buffer.rewards.eq(1.0).all()  # CartPole pays 1 per step
            assert remote.buffer.log_probs.le(0).all() and remote.buffer.obs.isfinite().all()
            local.update(64 * (it + 1))
            remote.update(64 * (it + 1))
            assert remote.learner.weights_seq_no == seq + 1
        seqs = ray.get([a.current_weights_seq_no.remote() for a in group.actors])
        assert seqs == [2, 2]  # the weights of the third collect, after two updates
        stats = group.pop_times()
        assert stats["env_runners/weights_lag"] == 0.0
        assert stats["env_runners/restarts"] == 0.0
        assert remote.runner.episodes.stats()["episode/count"] > 0
    finally:
        local.close()
        remote.close()


def test_runner_steps_its_envs_in_threads_and_samples_as_sync(ray_instance: None) -> None:
    """backend=gymnasium-thread reaches the runners: a runner's 8 envs that sleep 40 ms per
    step take about T x 40 ms per fragment, not the 8 x T x 40 ms of the sequential backend
    (the same runner algorithm in this process); the fragment itself (steps, observations,
    actions, rewards, episode ends) equals the sequential one's, same seeds and weights.

    Few long sleeps rather than many short ones, and the bound is 0.6 of the sequential
    runner's own measured time (both under the same load; threads ideally take 1/8 of
    it): a fixed 0.4 of the nominal time failed at 0.54 beside three other jobs on two
    cores."""
    steps, m, sleep_s = 4, 8, 0.04
    sets = ["num_env_runners=1", f"num_envs={m}", f"ppo.rollout_steps={steps}",
            "ppo.minibatch_size=32", "max_weight_lag=0", f"env_kwargs.sleep_s={sleep_s}",
            "env_kwargs.max_episode_steps=3"]
    threaded = config(*sets, "backend=gymnasium-thread", env=SLOW_ENV)
    remote = build_algorithm(threaded)
    # What a sequential runner 0 would build: its seed, its envs, the learner's weights.
    local = build_algorithm(runner_config(dataclasses.replace(threaded, backend="gymnasium"),
                                          0))
    try:
        local.set_policy_state(remote.get_policy_state())
        [frag] = remote.runner.take(1)
        ref = FragmentSampler(local, steps).sample(0)
        assert frag.steps == ref.steps == steps * m
        for name in ("obs", "actions", "log_probs", "rewards", "terminated", "truncated",
                     "next_obs", "last_obs"):
            assert torch.equal(getattr(frag, name), getattr(ref, name)), name
        assert frag.truncated.any()  # episodes ended inside the fragment (3-step limit)
        assert ref.env_s >= m * steps * sleep_s
        assert frag.env_s < 0.6 * ref.env_s, (frag.env_s, ref.env_s)
    finally:
        local.close()
        remote.close()


class _KillRunner:
    """A trainer callback that kills runner 0 with ``ray.kill`` after step ``at``, while
    its next fragment is being sampled (runners sample ahead, the env is slow)."""

    def __init__(self, session: Session, at: int) -> None:
        self.session, self.at, self.steps = session, at, 0

    def on_step(self, trainer: Trainer, stats: dict[str, float]) -> None:
        self.steps += 1
        if self.steps == self.at:
            group: Any = self.session.algorithm.runner
            assert group._inflight, "no fragment in flight to interrupt"
            ray.kill(group.actors[0], no_restart=False)
            _wait_until_back(group.actors[0])

    def on_eval(self, trainer: Trainer, stats: dict[str, float]) -> None:
        pass


def _wait_until_back(actor: Any, timeout_s: float = 180.0) -> None:
    """Block until Ray has restarted ``actor``, so the run still has iterations left in
    which the group sees the restart (a failed call, or a fragment from the new life)
    rather than finishing on the other runner's fragments first.

    Each call waits at most 10 s and is retried: on a loaded machine one call can block
    for most of a minute and then report the actor as still restarting."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            ray.get(actor.current_weights_seq_no.remote(), timeout=10.0)
            return
        except (RayActorError, GetTimeoutError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_killed_runner_is_restarted_and_training_finishes(ray_instance: None,
                                                          tmp_path: Path) -> None:
    cfg = build_config("ppo", SLOW_ENV, sets=[
        *QUIET, "num_env_runners=2", "num_envs=2", "ppo.rollout_steps=32",
        "ppo.minibatch_size=32", "total_env_steps=640", "eval_every=0", "eval_episodes=1",
        "env_kwargs.sleep_s=0.002", "env_kwargs.max_episode_steps=50"])
    session = Session(cfg, tmp_path / "run")
    session.trainer.callbacks.append(_KillRunner(session, at=2))
    result = session.run()
    assert result.env_steps == 640
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    restarts = [r["env_runners/restarts"] for r in rows if "env_runners/restarts" in r]
    assert restarts[-1] >= 1, restarts


def test_failed_runner_without_restart_stops_with_its_error(
        ray_instance: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = failed_runner_error("ppo", tmp_path / "run", capsys, "ppo.minibatch_size=32")
    assert line.startswith("rlloop: error: env runner 0 failed: "), line


@pytest.mark.slow
def test_ppo_with_two_runners_solves_cartpole(ray_instance: None, tmp_path: Path) -> None:
    cfg = config("num_env_runners=2", "eval_episodes=32")
    result = Session(cfg, tmp_path / "run").run()
    assert result.stopped_by == "solved", result.last_stats


def test_runner_transitions_reach_replay_with_clipped_rewards(ray_instance: None) -> None:
    """clip_rewards holds on the runner path too (the Atari DQN presets set it): the
    replay stores each Pendulum reward's sign, as the in-process loop does."""
    cfg = config("num_env_runners=1", "num_envs=2", "td3.learning_starts=1000",
                 "td3.clip_rewards=true", algo="td3", env="Pendulum-v1")
    algorithm: Any = build_algorithm(cfg)
    try:
        while len(algorithm.loop.replay) < 64:
            algorithm.collect()
        rewards = algorithm.loop.replay.sample(64).reward
        assert set(rewards.tolist()) <= {-1.0, 0.0} and rewards.min() == -1.0
    finally:
        algorithm.close()


def test_a_ppo_rollout_holds_one_fragment_of_each_runner(ray_instance: None) -> None:
    """Runner 0 is fast, runner 1 slow: with sampling ahead (max_weight_lag=1) runner 0
    delivers a second fragment while runner 1's is awaited. It waits for the next rollout
    instead of filling runner 1's columns (whose reward-normaliser return and episode
    streams would then continue another env's)."""
    cfg = config("backend=gymnasium", "num_envs=4", "num_env_runners=2",
                 "ppo.rollout_steps=8", "ppo.minibatch_size=32", "ppo.normalize_rewards=true",
                 env="runner_envs:rlloop-test/SlowFromSeed-v0")
    algorithm: Any = build_algorithm(cfg)
    group: Any = algorithm.runner
    take, taken = group.take, []

    def recorded(*args: Any, **kwargs: Any) -> Any:
        out = take(*args, **kwargs)
        taken.append([f.runner for f in out])
        return out

    group.take = recorded
    try:
        for it in range(4):
            algorithm.collect()
            algorithm.update(32 * (it + 1))
        assert taken == [[0, 1]] * 4
        assert algorithm.reward_running.max() < 1 / (1 - 0.99)  # a real discounted return
    finally:
        algorithm.close()


def test_a_dropped_fragment_restarts_its_runners_streams(ray_instance: None) -> None:
    """A fragment dropped for lag leaves a gap in its runner's envs: its n-step windows and
    running episode totals restart (they would join steps before and after the gap)."""
    cfg = config("num_env_runners=2", "num_envs=4", "fragment_steps=8", "max_weight_lag=1",
                 "dqn.n_step=3", "dqn.learning_starts=100000", "backend=gymnasium",
                 algo="dqn", env="runner_envs:rlloop-test/Counter20-v0")
    algorithm: Any = build_algorithm(cfg)
    group: Any = algorithm.runner
    try:
        for _ in range(6):
            algorithm.env_step()
        group.pop_restarted()
        algorithm.learner.weights_seq_no += 1
        group._weights()  # two versions published while fragments are in flight
        algorithm.learner.weights_seq_no += 1
        for _ in range(6):
            algorithm.env_step()
        assert group.dropped > 0
        replay = algorithm.loop.replay
        batch = replay.sample(4 * len(replay))
        # Each transition spans 3 steps of one episode, or ends it early (step 20).
        span = batch.next_obs[:, 0] - batch.obs[:, 0]
        ends = (batch.next_obs[:, 0] == 20) & batch.terminated.bool()
        assert ((span == 3) | (ends & (span > 0) & (span <= 3))).all(), span.unique()
        stats = group.episodes.stats()
        assert stats["episode/length_mean"] == 20.0, stats
    finally:
        algorithm.close()


def test_a_resume_with_runners_restarts_what_the_learner_carried(ray_instance: None) -> None:
    cfg = config("num_env_runners=2", "num_envs=4", "ppo.rollout_steps=16",
                 "ppo.minibatch_size=64", "ppo.normalize_rewards=true", "max_weight_lag=0")
    first: Any = build_algorithm(cfg)
    try:
        first.collect()
        first_obs = first.buffer.obs[0].clone()
        first.update(64)
        state = first.get_state()
    finally:
        first.close()
    assert state["reward_norm"]["running"].abs().sum() > 0
    resumed: Any = build_algorithm(cfg)
    try:
        resumed.set_state(state)
        assert resumed.runner.restarted_at_resume
        assert torch.count_nonzero(resumed.reward_running) == 0
        assert resumed.reward_stats.count == state["reward_norm"]["count"]
        # the runners' new episodes are not the run's first ones again (they were: each
        # runner's seed is the run's, whatever the sitting)
        resumed.collect()
        assert not torch.equal(resumed.buffer.obs[0], first_obs)
    finally:
        resumed.close()


def test_an_env_config_is_refused_with_runners(ray_instance: None) -> None:
    cfg = config("num_env_runners=1", "num_envs=2", "ppo.rollout_steps=16",
                 "ppo.minibatch_size=32", "horizons_per_env_reset=1")
    algorithm: Any = build_algorithm(cfg)
    try:
        with pytest.raises(ConfigError, match="env_config cannot reach envs"):
            Trainer(algorithm).step(env_config={"max_episode_steps": 5})
        algorithm.collect()  # the runners are still there
    finally:
        algorithm.close()


@pytest.mark.slow
def test_offpolicy_runners_fill_replay_and_learn(ray_instance: None, tmp_path: Path) -> None:
    cfg = config("num_env_runners=2", "num_envs=2", "total_env_steps=30000",
                 "solve_threshold=200", "solve_episodes=20", algo="dqn")
    session = Session(cfg, tmp_path / "run")
    algorithm: Any = session.algorithm
    result = session.run()
    assert len(algorithm.loop.replay) == result.env_steps
    assert result.best_eval_return is not None and result.best_eval_return >= 200, \
        result.last_stats


@pytest.mark.slow
@pytest.mark.heavy
def test_sac_with_two_runners_learns_pendulum(ray_instance: None, tmp_path: Path) -> None:
    cfg = config("num_env_runners=2", "num_envs=2", "total_env_steps=20000",
                 "sac.eval_interval=2000", algo="sac", env="Pendulum-v1")
    result = Session(cfg, tmp_path / "run").run()
    assert result.best_eval_return is not None and result.best_eval_return >= -200, \
        result.last_stats


@pytest.mark.slow
def test_scale_benchmark_runs(ray_instance: None, capsys: pytest.CaptureFixture[str]) -> None:
    """benchmarks/scale.py keeps working: a tiny budget, rlloop only (no RLlib here)."""
    import runpy

    script = TESTS.parent / "benchmarks" / "scale.py"
    scale = runpy.run_path(str(script))
    assert scale["main"](["--runners", "0", "1", "--envs", "sleep", "--seconds", "0.5"]) == 0
    out = capsys.readouterr().out
    assert "| sleep | 1 |" in out and "100%" in out  # one runner is its own yardstick


def test_a_cluster_address_where_nothing_listens_is_one_line_at_once(tmp_path, cli_env):
    """Ray retried ``--ray-address 127.0.0.1:1`` for minutes, with no rlloop error. (In a
    process of its own: this one may hold the module's Ray instance, which a connected
    process uses as it is.)"""
    import socket
    import subprocess
    import sys

    with socket.socket() as probe:  # a port that was free a moment ago: nothing listens
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    out = subprocess.run(
        [sys.executable, "-m", "rlloop", "train", "ppo", "--env", "CartPole-v1", "--set",
         "num_env_runners=1", "--ray-address", f"127.0.0.1:{port}", "--run-dir",
         str(tmp_path / "run"), "--set", "mlflow=false", "--quiet"],
        env=cli_env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    err = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(err) == 1, err
    assert err[0].startswith(f"rlloop: error: no Ray cluster answers at 127.0.0.1:{port}")
    assert not (tmp_path / "run").exists()


def test_a_cluster_address_that_accepts_and_never_answers_is_one_line_in_seconds(tmp_path,
                                                                               cli_env):
    """An address where something accepts the TCP connection and never replies (a firewall
    or proxy that takes any connection, a hung server) passed the connect check: Ray then
    printed a warning every few seconds for minutes before a ConnectionError (exit 1). A
    socket that listens and never accepts is such an address: the kernel completes the
    handshake, nothing replies."""
    import socket
    import subprocess
    import sys

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        started = time.monotonic()
        out = subprocess.run(
            [sys.executable, "-m", "rlloop", "train", "ppo", "--env", "CartPole-v1", "--set",
             "num_env_runners=1", "--ray-address", f"127.0.0.1:{port}", "--run-dir",
             str(tmp_path / "run"), "--set", "mlflow=false", "--quiet"],
            env=cli_env, cwd=tmp_path, capture_output=True, text=True, timeout=90)
    err = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(err) == 1, err
    assert err[0].startswith(f"rlloop: error: no Ray cluster answers at 127.0.0.1:{port} "
                             "(nothing replied within 3 s); start one there"), err
    assert time.monotonic() - started < 45  # the start-up, then a 3 s wait
    assert not (tmp_path / "run").exists()


def test_the_reachability_check_tells_a_grpc_server_from_another_one() -> None:
    """Ray's GCS and client server speak gRPC: a gRPC server passes the check, a server of
    another protocol there is refused in one line."""
    import socket
    import threading
    from concurrent import futures

    import grpc

    from rlloop.runners.ray_cluster import check_reachable

    grpc_server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    port = grpc_server.add_insecure_port("127.0.0.1:0")
    grpc_server.start()
    try:
        check_reachable(f"127.0.0.1:{port}")
        check_reachable(f"ray://127.0.0.1:{port}")
    finally:
        grpc_server.stop(None)

    with socket.socket() as web:
        web.bind(("127.0.0.1", 0))
        web.listen()

        def answer_as_http() -> None:
            conn, _ = web.accept()
            with conn:
                conn.recv(64)
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")

        thread = threading.Thread(target=answer_as_http, daemon=True)
        thread.start()
        address = f"127.0.0.1:{web.getsockname()[1]}"
        with pytest.raises(ConfigError, match=rf"no Ray cluster answers at {address} \(the "
                                              r"server there does not speak Ray's gRPC\)"):
            check_reachable(address)
        thread.join(5)


class _ScriptNet(torch.nn.Module):
    """A user network; the test below makes it one of the training script's."""

    def __init__(self, obs_shape: tuple[int, ...]) -> None:
        # (no zero-argument super(): its class cell would name this module's class, not
        # the copy Ray unpickles once the test has made it a `__main__` one)
        torch.nn.Module.__init__(self)
        self.features_dim = 16
        self.net = torch.nn.Linear(obs_shape[0], 16)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.net(obs))


def test_a_network_of_the_training_script_reaches_the_runners(
        ray_instance: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A runner imported `__main__:Net`, found its own `__main__` instead (Ray's worker)
    and failed; Ray restarted it for 300 s before the run failed."""
    from rlloop.modules.custom import net_path

    monkeypatch.setattr(_ScriptNet, "__module__", "__main__")  # as `python train.py` has it
    path = net_path(_ScriptNet)  # what PPO(policy=Net) does
    assert path == "__main__:_ScriptNet"
    cfg = config("num_env_runners=1", "num_envs=2", "ppo.rollout_steps=32",
                 "ppo.minibatch_size=32", "total_env_steps=128", "eval_every=0",
                 "eval_episodes=1", "max_restarts=0", f"ppo.net={path}")
    result = Session(cfg, tmp_path / "run").run()
    assert result.env_steps == 128


def test_a_runner_that_cannot_start_fails_the_run_at_once(
        ray_instance: None, tmp_path: Path) -> None:
    """A runner whose constructor fails the same way every time was restarted by Ray
    until RESTART_TIMEOUT_S (300 s) ran out."""
    from rlloop.runners.ray_runners import EnvRunnerError

    cfg = build_config("ppo", f"runner_envs:{runner_envs.HOME_ONLY_ID}", sets=[
        *QUIET, "num_env_runners=1", "num_envs=2", "ppo.rollout_steps=32",
        "ppo.minibatch_size=32", "total_env_steps=128", "eval_every=0", "eval_episodes=1",
        f"env_kwargs.home_pid={os.getpid()}", "max_restarts=3"])
    start = time.monotonic()
    with pytest.raises(EnvRunnerError, match=r"env runner 0 could not start: .*HomeOnly can "
                                             r"only be made in process"):
        Session(cfg, tmp_path / "run").run()
    assert time.monotonic() - start < 120


def test_a_runner_that_cannot_start_on_a_resume_is_the_same_one_line(
        ray_instance: None) -> None:
    """The resume's runner restart raised Ray's own ActorDiedError (exit 1, "unexpected")."""
    from rlloop.runners.ray_runners import EnvRunnerError

    cfg = build_config("ppo", f"runner_envs:{runner_envs.HOME_ONLY_ID}", sets=[
        *QUIET, "num_env_runners=1", "num_envs=2", "ppo.rollout_steps=32",
        "ppo.minibatch_size=32", f"env_kwargs.home_pid={os.getpid()}", "max_restarts=3"])
    algo: Any = build_algorithm(cfg)
    try:
        with pytest.raises(EnvRunnerError, match=r"env runner 0 could not start"):
            algo.set_state(algo.get_state())
    finally:
        algo.close()
