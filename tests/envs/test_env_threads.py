"""The "gymnasium-thread" backend: sub-envs stepped at once in threads, results exactly
those of "gymnasium" (SyncVectorEnv). Real envs, real sleeps, real threads."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import raising_env  # noqa: F401  (registers RaisingCartPole-v0)
import torch

import rlloop.envs.slow  # noqa: F401  (registers SlowCartPole-v1)
from rlloop.cli.main import main as cli_main
from rlloop.envs.core import VecEnv
from rlloop.envs.gym_threads import ThreadedVectorEnv
from rlloop.envs.registry import make_env
from rlloop.errors import EnvError

SLOW = "rlloop.envs.slow:SlowCartPole-v1"


def rollout(env: VecEnv, actions: torch.Tensor) -> list[torch.Tensor]:
    out = [env.reset()]
    for a in actions:
        res = env.step(a)
        out += [res.obs, res.reward, res.terminated, res.truncated, res.final_obs]
    return out


def test_threaded_steps_equal_sync_steps_and_threads_stop_on_close() -> None:
    """Same seeds, same actions: every observation, reward, end flag and final
    observation equal the sequential backend's, episodes ending mid-rollout included;
    the RNG state equals too (exact resume), and close() ends the threads."""
    kwargs = {"sleep_s": 0.0, "max_episode_steps": 7}
    actions = torch.randint(2, (40, 4), generator=torch.Generator().manual_seed(0))
    sync_env = make_env(SLOW, 4, backend="gymnasium", seed=3, env_kwargs=kwargs)
    threaded = make_env(SLOW, 4, backend="gymnasium-thread", seed=3, env_kwargs=kwargs)
    assert isinstance(getattr(threaded, "_vec", None), ThreadedVectorEnv)
    expected, got = rollout(sync_env, actions), rollout(threaded, actions)
    assert all(torch.equal(x, y) for x, y in zip(expected, got, strict=True))
    truncated = torch.stack(got[4::5])
    assert truncated.sum() >= 4 * 5  # every env ended episodes (7-step limit) on the way
    assert str(threaded.get_state()) == str(sync_env.get_state())
    sync_env.close()
    threaded.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("rlloop-env")]


def test_threaded_envs_wait_at_once() -> None:
    """8 envs that sleep 50 ms per step: 3 batched steps take about 3 x 50 ms, not the
    8 x 3 x 50 ms = 1.2 s of stepping them one after another (the bound, 0.4 of that,
    leaves a loaded machine 0.33 s of thread wake-ups)."""
    n, steps, sleep_s = 8, 3, 0.05
    env = make_env(SLOW, n, backend="gymnasium-thread", seed=0,
                   env_kwargs={"sleep_s": sleep_s})
    env.reset()
    t0 = time.perf_counter()
    for _ in range(steps):
        env.step(torch.zeros(n, dtype=torch.int64))
    elapsed = time.perf_counter() - t0
    env.close()
    assert steps * sleep_s <= elapsed < 0.4 * n * steps * sleep_s, elapsed


def test_env_raising_in_a_thread_is_one_env_error() -> None:
    env = make_env("raising_env:RaisingCartPole-v0", 3, backend="gymnasium-thread", seed=0,
                   env_kwargs={"after": 2})
    env.reset()
    for _ in range(2):
        env.step(torch.zeros(3, dtype=torch.int64))
    with pytest.raises(EnvError, match=r"raised RuntimeError in step\(\): simulated bug at "
                                       r"step 3; fix the env"):
        env.step(torch.zeros(3, dtype=torch.int64))
    env.close()


def test_cli_trains_with_the_thread_backend(tmp_path: Path) -> None:
    code = cli_main(["train", "ppo", "--env", SLOW, "--backend", "gymnasium-thread",
                     "--run-dir", str(tmp_path / "run"), "--quiet",
                     *[arg for s in ("mlflow=false", "progress=false", "save_video=false",
                                     "num_envs=4", "ppo.rollout_steps=16",
                                     "ppo.minibatch_size=32", "total_env_steps=128",
                                     "eval_episodes=1", "env_kwargs.sleep_s=0.0",
                                     "env_kwargs.max_episode_steps=20")
                       for arg in ("--set", s)]])
    assert code == 0
    assert "backend: gymnasium-thread" in (tmp_path / "run" / "config.yaml").read_text()
