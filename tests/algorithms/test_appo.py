"""APPO and IMPALA: bad settings answer in one line before torch; runner processes sample
fragments tagged with their weights' version; with one runner at lag 0 a resume is exact;
a killed runner is started again and the run goes on; learning on CartPole (heavy)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cli_runs import QUIET, failed_runner_error
from conftest import leaves, same_leaf

from rlloop.checkpoint import CheckpointManager, load_checkpoint
from rlloop.config.loading import build_config
from rlloop.errors import ConfigError

#: One runner, 4 envs, fragments of 16 steps: 64 env steps an iteration.
SMALL = [*QUIET, "num_env_runners=1", "num_envs=4", "appo.fragments_per_batch=1",
         "eval_every=0", "eval_episodes=2", "stop_on_solve=false"]


@pytest.mark.parametrize("algo", ["appo", "impala"])
@pytest.mark.parametrize(("item", "expected"), [
    ("{algo}.max_policy_lag=-1", "{algo}.max_policy_lag must be >= 0"),
    ("{algo}.queue_size=0", "{algo}.queue_size must be >= 1, got 0; set {algo}.queue_size=1"),
    ("num_env_runners=0", "{algo} learns from env runners that sample while it learns, and "
                          "num_env_runners is 0; set num_env_runners=1 or more"),
    ("{algo}.normalize_rewards=true", "{algo}.normalize_rewards is not supported"),
    ("backend=gymnasium-async", "{algo}'s env runners are processes that may start none "
                                "of their own"),
])
def test_bad_async_settings_are_one_line_naming_the_fix(algo: str, item: str,
                                                        expected: str) -> None:
    with pytest.raises(ConfigError) as e:
        build_config(algo, "CartPole-v1", sets=["num_env_runners=2", item.format(algo=algo)])
    assert str(e.value).startswith(expected.format(algo=algo)), e.value
    assert "\n" not in str(e.value)


def test_impala_refuses_several_learners_in_one_line() -> None:
    """IMPALA's one RMSprop step per batch has no data-parallel learner (APPO's has)."""
    with pytest.raises(ConfigError) as e:
        build_config("impala", "CartPole-v1", sets=["num_env_runners=2", "num_learners=2"])
    assert str(e.value) == ("num_learners=2 needs one of ['ppo', 'appo', 'sac'], not impala; "
                            "use num_learners=1")


def test_a_negative_policy_lag_stops_the_cli_before_torch(tmp_path: Path,
                                                          cli_env: dict[str, str]) -> None:
    probe = ("import json, sys\nfrom rlloop.cli.main import main\ncode = main(sys.argv[1:])\n"
             "print(json.dumps({'code': code, 'torch': 'torch' in sys.modules}))")
    out = subprocess.run([sys.executable, "-c", probe, "train", "appo", "--env", "CartPole-v1",
                          "--set", "appo.max_policy_lag=-2"], env=cli_env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"code": 2, "torch": False}
    assert out.stderr.strip() == ("rlloop: error: appo.max_policy_lag must be >= 0 (0: every "
                                  "fragment sampled with the newest weights), got -2")


def test_fragments_older_than_max_policy_lag_are_dropped_and_counted() -> None:
    """The learner's side alone (no processes): weights versions 0..5 published, lag 3
    allowed; fragments of versions 5, 3 and 2 (lags 0, 2, 3) are learned from, 1 (lag 4) is
    dropped; the metrics say so (mean lag of those kept, drops, the runners' steps/s
    counting all four)."""
    import torch

    from rlloop.runners.async_runners import AsyncRunnerProcesses
    from rlloop.runners.fragments import Fragment, FragmentEpisodes

    group = object.__new__(AsyncRunnerProcesses)
    group.max_lag, group.envs, group.device = 3, 1, torch.device("cpu")
    group._published = [0, 1, 2, 3, 4, 5]
    group.episodes = FragmentEpisodes(1, 1)
    group.obs = torch.zeros((1, 1))
    group.restarts = group.dropped = group._taken = group._arrived_steps = 0
    group._depth_sum = 0
    group._lag_sum = group._env_s = group._inference_s = group._wait_s = 0.0
    group._window_t0 = 0.0
    no = torch.zeros((4, 1), dtype=torch.bool)
    kept = []
    for version in (5, 3, 1, 2):
        frag = Fragment(torch.zeros((4, 1, 1)), torch.zeros((4, 1)), torch.ones((4, 1)),
                        torch.zeros((4, 1, 1)), no, no, torch.full((1, 1), version),
                        torch.zeros((4, 1)), version, 0)
        if group._accept(frag):
            kept.append(version)
    assert kept == [5, 3, 2]
    stats = group.pop_times()
    assert stats["env_runners/dropped_fragments"] == 1
    assert stats["env_runners/policy_lag"] == (0 + 2 + 3) / 3
    assert stats["env_runners/env_steps_per_s"] > 0 and group._arrived_steps == 0


def test_the_learner_scores_fragments_with_its_own_weights_through_vtrace() -> None:
    """In process, no runners: two fragments sampled with one set of weights, the weights
    then moved (a lag of one update). The batch holds the behaviour log-probabilities, and
    V-trace's advantages and targets of the current policy's log-probabilities and values,
    bootstrapped from V(next fragment start) at the end and from V(final obs) where an
    episode was truncated (episodes of 5 steps here); then one APPO update runs on it."""
    import dataclasses

    import torch

    from rlloop.learners.learner import DEFAULT_MODULE_ID
    from rlloop.losses.appo import appo_loss
    from rlloop.losses.ppo import PPOLossConfig, standardize
    from rlloop.losses.vtrace import vtrace
    from rlloop.runners.fragments import FragmentSampler
    from rlloop.runs.build import build_algorithm

    config = build_config("appo", "CartPole-v1", sets=[
        *QUIET, "num_env_runners=1", "num_envs=3", "appo.rollout_steps=8",
        "appo.minibatch_size=16", "backend=gymnasium", "env_kwargs.max_episode_steps=5"])
    algo: Any = build_algorithm(dataclasses.replace(config, num_env_runners=0))
    try:
        sampler = FragmentSampler(algo, 8)
        frags = [sampler.sample(0).tagged(0, i, 0) for i in range(2)]
        with torch.no_grad():
            for p in algo.policy.parameters():
                p.add_(0.1 * torch.randn_like(p))
        algo._fragments = frags
        batch = algo._batch()

        def joined(name: str) -> torch.Tensor:
            return torch.cat([getattr(f, name) for f in frags], dim=1)

        obs, actions, truncated = joined("obs"), joined("actions"), joined("truncated")
        assert truncated.any() and not joined("terminated").any()
        with torch.no_grad():
            dist, values = algo.policy.dist_value(obs.flatten(0, 1))
            pi = dist.log_prob(actions.flatten()).view(8, 6)
            values = values.view(8, 6)
            nxt = torch.cat([values[1:], algo.policy.value(
                torch.cat([f.last_obs for f in frags])).unsqueeze(0)])
            final = algo.policy.value(joined("next_obs").flatten(0, 1)).view(8, 6)
        nxt = torch.where(truncated, final, nxt)
        mu = joined("log_probs")
        assert (pi - mu).abs().max() > 1e-3  # the lag shows in the ratios
        ref = vtrace(pi, mu, joined("rewards"), values, nxt, joined("terminated"), truncated,
                     0.99)
        torch.testing.assert_close(batch.log_probs, mu.flatten(), rtol=0, atol=0)
        torch.testing.assert_close(batch.advantages, ref.advantages.flatten())
        torch.testing.assert_close(batch.returns, ref.targets.flatten())
        # the learner's loss on it is appo_loss: the ratio against mu, V-trace's targets
        learner, cfg = algo.learner, algo.config
        whole = learner.prepare_minibatch(DEFAULT_MODULE_ID, batch)
        loss, _ = learner.compute_loss_for_module(
            DEFAULT_MODULE_ID, cfg, whole, learner.forward_train(DEFAULT_MODULE_ID, whole))
        dist, now = algo.policy.dist_value(obs.flatten(0, 1))
        expected, _ = appo_loss(
            dist.log_prob(actions.flatten()), mu.flatten(), standardize(ref.advantages.flatten()),
            now, values.flatten(), ref.targets.flatten(), dist.entropy(),
            PPOLossConfig(cfg.clip_coef, cfg.vf_coef, cfg.ent_coef, cfg.clip_vf, False))
        torch.testing.assert_close(loss, expected, rtol=0, atol=1e-6)
        before = [p.clone() for p in algo.policy.parameters()]
        stats = algo.update(48)
        assert torch.isfinite(torch.tensor(stats["losses/policy"]))
        assert any(not torch.equal(a, b) for a, b in zip(before, algo.policy.parameters(),
                                                         strict=True))
    finally:
        algo.close()


def _final_state(run: Path) -> dict[str, Any]:
    last = max(CheckpointManager(run / "checkpoints").all(), key=lambda p: int(p.name))
    return load_checkpoint(last).components


@pytest.mark.slow
def test_one_runner_at_lag_0_resumes_exactly(tmp_path: Path) -> None:
    """256 env steps straight == 128, a crash that keeps only that checkpoint, a resume to
    256: every leaf of the final checkpoints is the same, the runner's envs and sampling
    RNG (saved from its process) included."""
    from rlloop.runs.start import resume, train

    config = build_config("appo", "CartPole-v1", flags={"seed": 4, "total_env_steps": 256},
                          sets=[*SMALL, "appo.max_policy_lag=0", "appo.rollout_steps=16",
                                "appo.minibatch_size=32", "checkpoint_every=2",
                                "keep_checkpoints=10"])
    train(config, tmp_path / "a")
    shutil.copytree(tmp_path / "a", tmp_path / "b", ignore=shutil.ignore_patterns(".lock"))
    for path in CheckpointManager(tmp_path / "b" / "checkpoints").all():
        if int(path.name) > 128:
            shutil.rmtree(path)
    resume(tmp_path / "b")
    a, b = _final_state(tmp_path / "a"), _final_state(tmp_path / "b")
    runner = a["algorithm"]["runner"]
    assert "runner_process" in runner  # the runner's own state is in the checkpoint
    pairs = dict(leaves(a)), dict(leaves(b))
    assert pairs[0].keys() == pairs[1].keys()
    differ = [k for k in pairs[0] if not same_leaf(pairs[0][k], pairs[1][k])]
    assert differ == ["/trainer/latest_eval/time/eval_s", "/trainer/wall_time"], differ


@pytest.mark.slow
def test_two_learner_processes_learn_as_one_learner(tmp_path: Path) -> None:
    """num_learners=2 (a spawned rank, gloo; no Ray without a cluster): one runner at lag 0
    samples the same fragments, and after 16 updates (128 env steps, 4 epochs of 2
    minibatches each) the weights equal one learner's to float rounding."""
    import torch
    from proc_utils import live_children

    from rlloop.config.ray import learner_actors
    from rlloop.runs.session import Session

    weights, starts = [], []
    for learners in (1, 2):
        config = build_config("appo", "CartPole-v1", flags={"seed": 3, "total_env_steps": 128},
                              sets=[*SMALL, "appo.max_policy_lag=0", "appo.rollout_steps=16",
                                    "appo.minibatch_size=32", f"num_learners={learners}"])
        assert learner_actors(config) == 0
        session = Session(config, tmp_path / str(learners))
        starts.append({k: v.clone() for k, v in session.algorithm.policy.state_dict().items()})
        assert session.run().env_steps == 128
        assert type(session.algorithm.learner).__name__ == (
            "APPOLearner" if learners == 1 else "DataParallelAPPOLearner")
        weights.append(session.algorithm.policy.state_dict())
    one, two = weights
    assert all(torch.equal(starts[0][k], starts[1][k]) for k in one)
    assert max(float((one[k] - starts[0][k]).abs().max()) for k in one) > 3e-3  # 16 steps
    assert max(float((one[k] - two[k]).abs().max()) for k in one) < 1e-6
    assert not live_children()


class _KillRunner:
    """Kills runner 0's process (SIGKILL) after step ``at``."""

    def __init__(self, session: Any, at: int) -> None:
        self.session, self.at, self.steps = session, at, 0

    def on_step(self, trainer: Any, stats: dict[str, float]) -> None:
        self.steps += 1
        if self.steps == self.at:
            process = self.session.algorithm.runner.processes[0]
            os.kill(process.pid, signal.SIGKILL)
            process.join(timeout=10)

    def on_eval(self, trainer: Any, stats: dict[str, float]) -> None:
        pass


@pytest.mark.slow
def test_a_killed_runner_is_started_again_and_training_finishes(tmp_path: Path) -> None:
    from rlloop.runs.session import Session

    config = build_config("appo", "CartPole-v1", flags={"total_env_steps": 640},
                          sets=[*SMALL, "appo.rollout_steps=16", "appo.minibatch_size=32"])
    session = Session(config, tmp_path / "run")
    session.trainer.callbacks.append(_KillRunner(session, at=2))
    result = session.run()
    assert result.env_steps == 640
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    restarts = [r["env_runners/restarts"] for r in rows if "env_runners/restarts" in r]
    assert restarts[-1] == 1, restarts
    lags = [r["env_runners/policy_lag"] for r in rows if "env_runners/policy_lag" in r]
    assert max(lags) <= 8 and any("env_runners/queue_depth" in r for r in rows)


@pytest.mark.slow
def test_a_failed_runner_without_restart_stops_with_its_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = failed_runner_error("appo", tmp_path / "run", capsys)
    assert line.startswith("rlloop: error: env runner 0 failed: EnvError: "), line


@pytest.mark.heavy
@pytest.mark.parametrize("algo", ["appo", "impala"])
def test_solves_cartpole_with_two_runner_processes(algo: str, tmp_path: Path) -> None:
    """The defaults with 2 runners of 8 envs (the command of the docs page): an evaluation
    reaches 475 and fresh episodes confirm it, within 200k env steps."""
    from rlloop.runs.session import Session

    config = build_config(algo, "CartPole-v1", flags={"total_env_steps": 200_000},
                          sets=[*QUIET, "num_env_runners=2"])
    result = Session(config, tmp_path / "run").run()
    assert result.stopped_by == "solved", result.last_stats


@pytest.mark.heavy
def test_with_a_ray_address_the_runners_are_ray_actors(tmp_path: Path) -> None:
    """``ray.address`` set (here: the instance this process is connected to): the existing
    Ray env runners sample for APPO, with max_policy_lag as their max_weight_lag."""
    from rlloop.config.ray import RayConfig
    from rlloop.runners.ray_cluster import connect, disconnect
    from rlloop.runners.ray_runners import RayEnvRunnerGroup
    from rlloop.runs.session import Session

    started = connect(RayConfig(num_cpus=2), num_runners=2)
    try:
        config = build_config("appo", "CartPole-v1", flags={"total_env_steps": 1024},
                              sets=[*SMALL, "num_env_runners=2", "ray.address=auto",
                                    "appo.max_policy_lag=3"])
        session = Session(config, tmp_path / "run")
        group = session.algorithm.runner
        assert isinstance(group, RayEnvRunnerGroup) and group.config.max_weight_lag == 3
        assert session.run().env_steps == 1024
    finally:
        disconnect(started)


@pytest.mark.heavy
def test_the_slow_runner_benchmark_runs(capsys: pytest.CaptureFixture[str]) -> None:
    """benchmarks/appo.py, APPO alone on a budget of seconds (PPO's side starts Ray)."""
    import runpy

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "appo.py"
    import torch

    module = runpy.run_path(str(script), run_name="appo_benchmark")
    threads = torch.get_num_threads()
    try:
        assert module["main"](["--only", "appo", "--budget-s", "3", "--target", "1e9"]) == 0
    finally:
        torch.set_num_threads(threads)  # the benchmark runs on one
    out = capsys.readouterr().out
    assert "| rlloop appo |" in out and '"reached": false' in out
