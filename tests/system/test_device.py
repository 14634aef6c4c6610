"""Devices: every tensor on the run's device, checkpoints that load on any device.

The smoke tests run each algorithm (and a task) with ``device="cpu"`` while torch's
default device is ``meta``: a tensor made anywhere without an explicit device is then a
meta tensor, and the first operation that mixes it with a real one, or reads it, fails.
The same runs repeat on CUDA where a GPU is present.
"""

from __future__ import annotations

import json
import logging
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pixel_envs
import pytest
import torch
import yaml
from conftest import rlloop_cmd
from sign_task import SignTask, sign_policy

from rlloop.checkpoint import (
    CheckpointManager,
    capture_rng_state,
    load_checkpoint,
    restore_rng_state,
    save_checkpoint,
    save_replacing,
)
from rlloop.cli.main import EVAL_KEYS
from rlloop.config.loading import build_config
from rlloop.config.run_config import RunConfig
from rlloop.data.returns import gae
from rlloop.data.rollout import RolloutBuffer
from rlloop.envs import make_env
from rlloop.errors import ConfigError
from rlloop.runners.env_runner import EnvRunner, EpisodeTracker
from rlloop.runs.build import build_algorithm
from rlloop.runs.saved import evaluate_run
from rlloop.runs.start import resume, train
from rlloop.system.devices import arrays_to_device, packed_to_device, resolve_device
from rlloop.tasks import TaskConfig, TaskTrainer
from rlloop.trainers.loop import Trainer

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
DEVICES = ["cpu", pytest.param("cuda", marks=CUDA)]

#: (algorithm, env, settings): every algorithm, and the env paths each one exercises.
RUNS = {
    "ppo-native": ("ppo", "CartPole-v1", ["ppo.rollout_steps=16", "ppo.minibatch_size=32",
                                          "ppo.normalize_obs=true",
                                          "ppo.normalize_rewards=true"]),
    "ppo-lstm": ("ppo", "CartPole-v1", ["ppo.recurrent=lstm", "env.mask_velocity=true",
                                        "ppo.rollout_steps=20", "ppo.seq_len=8",
                                        "ppo.minibatch_size=32", "ppo.normalize_obs=true"]),
    "ppo-gymnasium": ("ppo", "Pendulum-v1", ["backend=gymnasium", "ppo.rollout_steps=16",
                                             "ppo.minibatch_size=32"]),
    "dqn": ("dqn", "CartPole-v1", ["dqn.learning_starts=16", "dqn.batch_size=16"]),
    "dqn-nstep-prioritized": ("dqn", "CartPole-v1", [
        "dqn.learning_starts=16", "dqn.batch_size=16", "dqn.n_step=3",
        "dqn.replay=prioritized"]),
    "sac": ("sac", "Pendulum-v1", ["sac.learning_starts=16", "sac.batch_size=16"]),
    "td3": ("td3", "Pendulum-v1", ["td3.learning_starts=16", "td3.batch_size=16"]),
    "ma_ppo": ("ma_ppo", "pettingzoo:classic.tictactoe_v3", [
        "ma_ppo.rollout_steps=8", "ma_ppo.minibatch_size=16",
        "ma_ppo.policy_mapping=independent"]),
}


def _config(name: str, device: str, seed: int = 0) -> RunConfig:
    algo, env, sets = RUNS[name]
    return build_config(algo, env, flags={"seed": seed}, sets=[
        "mlflow=false", "progress=false", "num_envs=4", "eval_episodes=2",
        f"device={device}", *sets])


@pytest.fixture
def meta_default() -> Iterator[None]:
    """torch's default device is ``meta`` inside the test."""
    torch.set_default_device("meta")
    try:
        yield
    finally:
        torch.set_default_device(None)


def _tensors(node: Any) -> Iterator[torch.Tensor]:
    if isinstance(node, torch.Tensor):
        yield node
    elif isinstance(node, dict):
        for v in node.values():
            yield from _tensors(v)
    elif isinstance(node, list | tuple):
        for v in node:
            yield from _tensors(v)


# ---- the device setting ---------------------------------------------------------------
def test_device_setting_is_validated_and_auto_picks_cuda_when_present():
    assert RunConfig().device == "auto"
    assert resolve_device("auto") == torch.device("cuda" if torch.cuda.is_available() else "cpu")
    assert build_config("ppo", sets=["device=cpu"]).device == "cpu"
    for bad in ("gpu", "cuda:x", "CPU", "cuda0"):
        with pytest.raises(ConfigError, match="device must be one of auto, cpu, cuda"):
            build_config("ppo", sets=[f"device={bad}"])
    with pytest.raises(ConfigError, match="device must be one of"):
        TaskConfig(device="tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match=r"no CUDA.*use device=cpu or auto"):
            resolve_device("cuda:0")


def test_cli_rejects_a_bad_device_in_one_line(tmp_path, cli_env):
    out = subprocess.run(rlloop_cmd("train", "ppo", "--device", "tpu", "--quiet"),
                         cwd=tmp_path, env=cli_env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "rlloop: error: device must be one of auto, cpu, cuda, cuda:N or mps, got 'tpu'"]


# ---- no implicit devices: every algorithm under torch.set_default_device("meta") -------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(RUNS))
def test_every_algorithm_runs_with_meta_as_default_device(name, device, meta_default, tmp_path):
    algo = build_algorithm(_config(name, device))
    try:
        trainer = Trainer(algo, eval_episodes=2)
        for _ in range(3):
            stats = trainer.step()
        stats.update(trainer.eval())
        assert all(isinstance(v, float) for v in stats.values())
        params = list(algo.learner.modules.parameters())
        assert params and all(p.device.type == device for p in params)
        state = algo.get_state()
        assert all(t.device.type in (device, "cpu") for t in _tensors(state))
        save_checkpoint(tmp_path / "ckpt", {"algorithm": state, "rng": capture_rng_state()})
        loaded = load_checkpoint(tmp_path / "ckpt").components
        algo.set_state(loaded["algorithm"])
        restore_rng_state(loaded["rng"])
        trainer.step()
    finally:
        algo.close()


@pytest.mark.parametrize("device", DEVICES)
def test_a_task_runs_with_meta_as_default_device(device, meta_default, tmp_path):
    config = TaskConfig(num_epoch_samples=40, batch_size=10, lr=0.1, total_steps=8,
                        checkpoint_every=4, device=device)
    with torch.device("cpu"):
        model = sign_policy()
    stats = TaskTrainer(SignTask(config), model, run_dir=tmp_path).run()
    assert stats["train/steps"] == 8 and all(p.device.type == device for p in model.parameters())
    resumed = TaskTrainer(SignTask(config), model, run_dir=tmp_path, resume=True)
    assert resumed.state["train/steps"] == 8


# ---- no host synchronisation per env step --------------------------------------------
def test_episode_tracker_never_reads_the_device_until_stats():
    """On the meta device nothing can be read back: any host synchronisation in
    ``update`` would raise. ``stats`` is the one place that reads."""
    meta = EpisodeTracker(3, window=4, device="meta", log_steps=2)
    for _ in range(5):
        meta.update(torch.ones(3, device="meta"), torch.ones(3, dtype=torch.bool, device="meta"))
    with pytest.raises(NotImplementedError, match="meta"):
        meta.stats()


def test_episode_tracker_keeps_the_last_window_of_episodes_in_order():
    tracker = EpisodeTracker(3, window=4, log_steps=3)
    assert tracker.stats() == {"episode/count": 0.0}
    gen = torch.Generator(device="cpu").manual_seed(0)
    running, ended = [0.0] * 3, []
    for _ in range(40):
        reward = torch.rand(3, generator=gen, device="cpu")
        done = torch.rand(3, generator=gen, device="cpu") < 0.3
        tracker.update(reward, done)
        for i in range(3):
            running[i] += float(reward[i])
            if done[i]:
                ended.append(running[i])
                running[i] = 0.0
    # all envs end at once, more episodes than the window holds: the newest ones count
    for _ in range(2):
        tracker.update(torch.full((3,), 5.0, device="cpu"), torch.ones(3, dtype=torch.bool,
                                                                        device="cpu"))
        ended += [r + 5.0 for r in running]
        running = [0.0] * 3
    stats = tracker.stats()
    assert stats["episode/count"] == len(ended)
    assert stats["episode/return_mean"] == pytest.approx(sum(ended[-4:]) / 4)
    assert stats["episode/return_max"] == pytest.approx(max(ended[-4:]))
    again = EpisodeTracker(3, window=4, log_steps=3)
    again.set_state(tracker.get_state())
    assert again.stats() == stats
    # checkpoints of earlier versions hold the recent episodes as lists, oldest first
    old = {"returns": torch.zeros(3, dtype=torch.float64, device="cpu"),
           "lengths": torch.zeros(3, dtype=torch.int64, device="cpu"),
           "recent_returns": [1.0, 2.0, 3.0, 4.0, 9.0], "recent_lengths": [1, 2, 3, 4, 5],
           "episodes": 7}
    again.set_state(old)
    assert again.stats() == {"episode/return_mean": 4.5, "episode/return_max": 9.0,
                             "episode/length_mean": 3.5, "episode/count": 7.0}


def test_host_arrays_keep_their_dtype_in_the_one_transfer_off_the_cpu():
    # Off the CPU, a host env's step crosses in one transfer; uint8 frames once came
    # back as float32 0-255, which the CNN takes as already scaled (255x its inputs).
    frames = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4).transpose(2, 0, 1)
    arrays = [frames, np.array([1.5, -3.0], np.float32), np.array([True, False]),
              np.arange(3, dtype=np.int64), np.zeros((0, 3), np.float32),
              np.asarray(np.float32(2.0))]
    on_meta = arrays_to_device(arrays, torch.device("meta"))
    assert [(t.dtype, t.shape) for t in on_meta] == [
        (torch.from_numpy(a).dtype, torch.Size(a.shape)) for a in arrays]
    for a, t in zip(arrays, packed_to_device(arrays, torch.device("cpu")), strict=True):
        assert t.dtype == torch.from_numpy(a).dtype and np.array_equal(t.numpy(), a)
    empty = [np.zeros(0, np.uint8), np.zeros((0, 3), np.float32)]  # nothing to send at all
    assert [(t.dtype, t.shape) for t in packed_to_device(empty, torch.device("cpu"))] == [
        (torch.uint8, torch.Size([0])), (torch.float32, torch.Size([0, 3]))]


def test_pixel_observations_stay_uint8_on_any_device():
    pixel_envs.register()
    dtypes = []
    for device in ("cpu", "meta"):
        env = make_env("rlloop-test/SidePixels-v0", 2, "gymnasium", seed=0, device=device)
        dtypes.append(env.reset().dtype)
        env.close()
    assert dtypes == [torch.uint8, torch.uint8]


def test_next_obs_is_copied_only_where_an_episode_ended():
    env = make_env("CartPole-v1", 4, "gymnasium", seed=3)
    runner = EnvRunner(env, seed=3)
    buf = RolloutBuffer(60, 4, (4,), (), torch.int64)
    buf.next_obs.fill_(float("nan"))  # rows never written stay NaN
    runner.collect(lambda obs: (torch.zeros(len(obs), dtype=torch.int64, device="cpu"),
                                torch.zeros(len(obs), device="cpu")), buf)
    ended = buf.terminated | buf.truncated
    step_ended = ended.any(1)
    assert step_ended.any() and not step_ended.all()
    assert buf.next_obs[~step_ended].isnan().all()  # steps where nothing ended: no copy
    assert not buf.next_obs[ended].isnan().any()  # the final observation is kept
    env.close()


@pytest.mark.parametrize("algo_name", ["ppo", "a2c"])
def test_ppo_and_a2c_bootstrap_truncations_from_the_final_observation(algo_name):
    """PPO's batch (and A2C's, which values its rollout in the update, not as it acts)
    bootstraps truncated steps from their final observations; rows of steps where nothing
    ended hold stale data and must not leak."""
    algo = build_algorithm(build_config(algo_name, "CartPole-v1", sets=[
        "mlflow=false", "num_envs=4", "backend=gymnasium", "device=cpu",
        "env_kwargs={max_episode_steps: 5}", f"{algo_name}.rollout_steps=12",
        *(["ppo.minibatch_size=16"] if algo_name == "ppo" else [])]))
    assert (algo._rollout_values is None) == (algo_name == "a2c")
    algo.collect()
    algo.buffer.next_obs[~(algo.buffer.terminated | algo.buffer.truncated)] = 1e6  # stale
    batch = algo._batch()
    buf, value, cfg = algo.buffer, algo.policy.value, algo.config
    t, n = buf.steps, buf.num_envs
    assert buf.truncated.any()
    with torch.no_grad():
        values = value(buf.obs.flatten(0, 1)).view(t, n)
        following = torch.cat([buf.obs[1:], algo.runner.obs[None]])
        next_values = value(following.flatten(0, 1)).view(t, n)
        next_values[buf.truncated] = value(buf.next_obs[buf.truncated])
    _, returns = gae(buf.rewards, values, next_values, buf.terminated, buf.truncated,
                     cfg.gamma, cfg.gae_lambda)
    torch.testing.assert_close(batch.returns, returns.flatten())
    algo.close()


@CUDA
@pytest.mark.parametrize("name", ["ppo-native", "dqn"])
def test_native_env_steps_on_cuda_never_synchronise(name):
    """PPO's rollout and DQN's env steps (acting, env, replay, episode statistics) run
    with CUDA's sync debug mode set to raise on any synchronising call."""
    algo = build_algorithm(_config(name, "cuda"))
    ppo = name.startswith("ppo")
    for check in (False, True):  # the first round builds cached constants
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error" if check else "default")
        try:
            if ppo:
                algo.runner.collect(algo._behaviour, algo.buffer)
            else:
                for _ in range(40):  # warm-up steps, then epsilon-greedy ones
                    algo.env_step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    algo.close()


# ---- checkpoints across devices -------------------------------------------------------
def _train(run_dir: Path, device: str, steps: int = 512) -> None:
    train(build_config("ppo", flags={"total_env_steps": steps, "device": device}, sets=[
        "mlflow=false", "save_video=false", "progress=false", "stop_on_solve=false",
        "eval_every=0", "eval_episodes=3"]), run_dir)


def _eval_cli(cwd: Path, env: dict[str, str], run: str, *args: str) -> dict[str, float]:
    out = subprocess.run(rlloop_cmd("eval", run, "--episodes", "3", "--json", *args),
                         cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    # (the names 0.1.0 printed, kept beside these for a release, are the same numbers)
    return {k: v for k, v in json.loads(out.stdout).items() if k in EVAL_KEYS}


def _eval(run_dir: Path, device: str | None = None) -> dict[str, float]:
    stats = evaluate_run(run_dir, 3, device=device)
    return {k: stats[k] for k in ("return_mean", "return_std", "return_min", "return_max",
                                  "length_mean")}


def _as_if_saved_on_cuda(run_dir: Path) -> None:
    """Rewrite every checkpoint of a CPU run as a CUDA run writes it: CUDA generators
    keep a 16-byte state (seed, offset), the config and metadata name ``cuda``."""

    def swap(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: (torch.arange(16, dtype=torch.uint8, device="cpu")
                        if k in ("generator", "eval_generator") else swap(v))
                    for k, v in node.items()}
        return node

    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    (run_dir / "config.yaml").write_text(yaml.safe_dump({**config, "device": "cuda"}))
    for path in [run_dir / "best", *CheckpointManager(run_dir / "checkpoints").all()]:
        ckpt = load_checkpoint(path)
        components = {**ckpt.components, "algorithm": swap(ckpt.components["algorithm"])}
        metadata = {**ckpt.metadata, "device": "cuda:0",
                    "config": {**ckpt.metadata["config"], "device": "cuda"}}
        save_replacing(path, components, metadata=metadata)


def test_a_run_saved_on_cuda_evaluates_and_resumes_on_cpu(tmp_path, cli_env, caplog):
    run = tmp_path / "run"
    _train(run, "cpu")
    latest = CheckpointManager(run / "checkpoints").latest()
    assert load_checkpoint(latest).metadata["device"] == "cpu"
    before = _eval(run, "cpu")
    _as_if_saved_on_cuda(run)
    if not torch.cuda.is_available():  # the saved device is not here: a clear error
        with pytest.raises(ConfigError, match=r"has no CUDA.*use device=cpu"):
            _eval(run)
    # the weights are mapped onto the CPU: the same policy, the same returns
    assert _eval_cli(tmp_path, cli_env, "run", "--device", "cpu") == before
    with caplog.at_level(logging.WARNING, logger="rlloop.system.devices"):
        resume(run, device="cpu", total_env_steps=1024)
    assert "seeded afresh" in caplog.text  # CUDA generators cannot continue on the CPU
    resumed = load_checkpoint(CheckpointManager(run / "checkpoints").latest())
    assert resumed.metadata["device"] == "cpu" and resumed.metadata["env_steps"] >= 1024


@CUDA
def test_a_cuda_run_evaluates_and_resumes_on_cpu_and_back(tmp_path, cli_env):
    run = tmp_path / "run"
    _train(run, "cuda")
    latest = CheckpointManager(run / "checkpoints").latest()
    assert load_checkpoint(latest).metadata["device"] == "cuda"
    assert _eval_cli(tmp_path, cli_env, "run", "--device", "cpu")["length_mean"] > 0
    resume(run, device="cpu", total_env_steps=1024)
    assert load_checkpoint(CheckpointManager(run / "checkpoints").latest()
                           ).metadata["device"] == "cpu"
    assert _eval(run, "cuda")["length_mean"] > 0


@CUDA
def test_cuda_and_cpu_start_from_the_same_weights():
    cpu = build_algorithm(_config("sac", "cpu"))
    cuda = build_algorithm(_config("sac", "cuda"))
    for p, q in zip(cpu.learner.modules.parameters(), cuda.learner.modules.parameters(),
                    strict=True):
        assert torch.equal(p, q.cpu())
    cpu.close()
    cuda.close()
