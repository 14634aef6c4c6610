"""backend=envpool: Atari stepped by envpool's thread pool (skipped where it is missing)."""

from __future__ import annotations

import json
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import env_without, rlloop_cmd
from stepping import run_steps

from rlloop.config.loading import build_config
from rlloop.envs import env_spec, make_env
from rlloop.errors import EnvError
from rlloop.runs.build import build_algorithm

QUIET = ["mlflow=false", "progress=false", "save_video=false", "backend=envpool"]
TESTS = Path(__file__).parents[1]
needs_envpool = pytest.mark.skipif(
    not __import__("importlib").util.find_spec("envpool"), reason="envpool is not installed")


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(rlloop_cmd(*args), capture_output=True, text=True, timeout=120,
                          cwd=TESTS, env=env)


@needs_envpool
def test_envpool_steps_preprocessed_frames_and_resets_in_the_same_step():
    assert env_spec("ALE/Breakout-v5", backend="envpool") == env_spec("ALE/Breakout-v5")
    env = make_env("ALE/Breakout-v5", num_envs=3, backend="envpool", seed=0,
                   env_kwargs={"max_episode_steps": 60})
    try:
        obs = env.reset()
        assert obs.shape == (3, 4, 84, 84) and obs.dtype == torch.uint8
        lives_lost = games_cut = 0
        for _ in range(130):
            res = env.step(torch.randint(4, (3,)))
            assert not (res.terminated & res.truncated).any()
            lives_lost += int(res.terminated.sum())
            for i in torch.nonzero(res.terminated).flatten().tolist():
                # The next life started (no-op, FIRE, RIGHT) in the same step.
                assert not torch.equal(res.obs[i], res.final_obs[i])
            games_cut += int(res.truncated.sum())
            for i in torch.nonzero(res.truncated).flatten().tolist():
                # A new game in the same step: its stack starts from one repeated frame,
                # while the final observation is the old game's last one.
                assert not torch.equal(res.obs[i], res.final_obs[i])
                assert torch.equal(res.obs[i, 0], res.obs[i, -1])
        assert lives_lost > 0 and games_cut >= 3  # 60-step games cut twice in 130 steps
        assert res.obs.dtype == res.final_obs.dtype == torch.uint8
        state = env.get_state()
    finally:
        env.close()
    other = make_env("ALE/Breakout-v5", num_envs=3, backend="envpool", seed=5)
    try:
        other.set_state(state)  # another seed: the pool is rebuilt, and steps at once
        assert other.step(torch.zeros(3, dtype=torch.long)).obs.shape == (3, 4, 84, 84)
    finally:
        other.close()


@needs_envpool
def test_ppo_and_dqn_train_on_envpool_breakout_with_episode_stats():
    ppo = build_algorithm(build_config("ppo", "ALE/Breakout-v5", flags={"num_envs": 4}, sets=[
        *QUIET, "ppo.rollout_steps=64", "ppo.minibatch_size=128", "ppo.num_epochs=1"]))
    try:
        steps, stats = 0, {}
        while steps < 512:
            collected = ppo.collect()
            steps += int(collected["env/steps"])
            stats.update(collected)
            ppo.update(steps)
        assert ppo.buffer.obs.dtype == torch.uint8 and ppo.buffer.obs.shape == (64, 4, 4, 84, 84)
        # Random play loses lives within a few dozen steps: episodes (lives) are counted.
        assert stats["episode/count"] > 0 and "episode/return_mean" in stats
    finally:
        ppo.close()
    dqn = build_algorithm(build_config("dqn", "ALE/Breakout-v5", sets=[
        *QUIET, "dqn.learning_starts=200", "dqn.buffer_size=1000", "dqn.opt_interval=32"]))
    try:
        run_steps(dqn, 300)
        batch = dqn.loop.replay.sample(8)
        assert batch.obs.shape == (8, 4, 84, 84) and batch.obs.dtype == torch.uint8
    finally:
        dqn.close()


@needs_envpool
def test_envpool_rejects_non_atari_ids_and_unknown_kwargs():
    with pytest.raises(EnvError, match=r"runs only Atari ids .* not 'CartPole-v1'"):
        make_env("CartPole-v1", backend="envpool")
    with pytest.raises(EnvError, match=r"does not take env_kwargs \['obs_type'\]"):
        make_env("ALE/Breakout-v5", backend="envpool", env_kwargs={"obs_type": "ram"})


def test_cli_non_atari_id_on_envpool_exits_2(tmp_path):
    out = _cli("train", "ppo", "--env", "CartPole-v1", "--backend", "envpool",
               "--run-dir", str(tmp_path / "run"), "--set", "mlflow=false")
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines() == [
        "rlloop: error: backend 'envpool' runs only Atari ids (ALE/Pong-v5, "
        "PongNoFrameskip-v4), not 'CartPole-v1'; use backend='auto'"]


def test_cli_envpool_missing_exits_2_naming_the_extra(tmp_path):
    env = env_without("envpool", tmp_path)
    out = _cli("train", "dqn", "--env", "ALE/Pong-v5", "--backend", "envpool",
               "--run-dir", str(tmp_path / "run"), "--set", "mlflow=false", env=env)
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines() == [
        "rlloop: error: backend=envpool needs envpool, which is not installed: "
        "pip install 'rlloop[envpool]' (or use backend=auto)"]


@needs_envpool
def test_cli_trains_on_envpool_and_films_through_gymnasium(tmp_path, cli_in_process):
    """envpool renders no frames: the run's video comes from the gymnasium backend, whose
    preprocessing (and so the policy's input) is the same. (The command runs in process.)"""
    sets = ["mlflow=false", "progress=false", "total_env_steps=256", "ppo.rollout_steps=64",
            "ppo.minibatch_size=128", "ppo.num_epochs=1", "eval_episodes=1"]
    out = cli_in_process(["train", "ppo", "--env", "ALE/Breakout-v5", "--backend", "envpool",
                          "--num-envs", "4", "--run-dir", str(tmp_path / "run"),
                          *[a for s in sets for a in ("--set", s)]])
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "run" / "video.mp4").stat().st_size > 0


@needs_envpool
def test_atari_stepping_benchmark_runs_both_backends(monkeypatch, capsys):
    script = TESTS.parent / "benchmarks" / "atari_stepping.py"
    monkeypatch.setattr(sys, "argv", [str(script), "--steps", "5", "--rounds", "1",
                                      "--num-envs", "2", "--json"])
    monkeypatch.setattr(sys, "path", list(sys.path))  # the script adds src
    runpy.run_path(str(script), run_name="__main__")
    rows = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [r["backend"] for r in rows] == ["gymnasium", "envpool"]
    assert all(r["env_steps_per_s"] > 0 for r in rows)
