"""Env steps/s of rlloop's worker pools on a slow env, and against Gymnasium's AsyncVectorEnv.

The env spends ``--delay`` seconds per step, either sleeping (``--load sleep``: I/O or a
simulator that releases the GIL) or spinning on the CPU (``--load cpu``: pure-Python
physics that holds the GIL). Every pool has ``--workers`` workers and serves them with
one (random-action) inference call per batch:

* ``sync``: the workers' envs step one after another on the main thread;
* ``thread`` / ``process``: workers step concurrently, and the sampler takes whatever
  is ready (``max_wait_time=0``, the asynchronous mode) or waits for all of them
  (``lockstep``, ``max_wait_time=None``, which is what a vector env does);
* ``gym-async``: ``gymnasium.vector.AsyncVectorEnv`` with the same number of envs.

    python benchmarks/workers.py --load sleep --delay 0.002
    python benchmarks/workers.py --load cpu --delay 0.001
"""

from __future__ import annotations

import argparse
import functools
import time
from typing import Any, Literal, cast

import gymnasium
import numpy as np


class SlowEnv(gymnasium.Env):
    """A trivial env whose step costs ``delay`` seconds of sleep or of CPU work."""

    observation_space = gymnasium.spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = gymnasium.spaces.Discrete(2)

    def __init__(self, delay: float = 0.002, load: str = "sleep", episode_length: int = 200):
        self.delay, self.load, self.length, self.t = delay, load, episode_length, 0

    def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(4, np.float32), {}

    def step(self, action: Any) -> Any:
        if self.load == "sleep":
            time.sleep(self.delay)
        else:
            end = time.perf_counter() + self.delay
            while time.perf_counter() < end:
                pass
        self.t += 1
        return np.zeros(4, np.float32), 1.0, False, self.t >= self.length, {}


def random_actions(states: list[Any]) -> list[int]:
    return list(np.random.randint(0, 2, len(states)))


def pool_rate(env_fn: Any, mode: str, workers: int, steps: int, max_wait: float | None) -> float:
    from rlloop.envs.pool import WorkerPool
    from rlloop.tasks.sampling import iter_trajectories

    pool_mode = cast(Literal["sync", "thread", "process"], mode)
    with WorkerPool(env_fn, workers, pool_mode) as pool:
        for _ in iter_trajectories(pool, random_actions, total_samples=workers):  # warm up
            pass
        start = time.perf_counter()
        count = sum(len(t) for t in iter_trajectories(pool, random_actions, total_samples=steps,
                                                       max_wait_time=max_wait))
        return count / (time.perf_counter() - start)


def gym_async_rate(env_fn: Any, workers: int, steps: int) -> float:
    envs = gymnasium.vector.AsyncVectorEnv([env_fn] * workers)
    try:
        envs.reset(seed=0)
        start = time.perf_counter()
        for _ in range(steps // workers):
            envs.step(envs.action_space.sample())
        return (steps // workers) * workers / (time.perf_counter() - start)
    finally:
        envs.close()


def main() -> None:
    p = argparse.ArgumentParser(description="env steps/s of rlloop's worker pools")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--steps", type=int, default=2000, help="env steps per measurement")
    p.add_argument("--delay", type=float, default=0.002, help="seconds per env step")
    p.add_argument("--load", choices=("sleep", "cpu"), default="sleep")
    p.add_argument("--repeats", type=int, default=3,
                   help="best of this many runs (other load on the machine only slows down)")
    args = p.parse_args()

    env_fn = functools.partial(SlowEnv, args.delay, args.load)
    n, steps = args.workers, args.steps
    measures = {
        "sync": lambda: pool_rate(env_fn, "sync", n, steps // 4, None),
        "thread": lambda: pool_rate(env_fn, "thread", n, steps, 0.0),
        "thread lockstep": lambda: pool_rate(env_fn, "thread", n, steps, None),
        "process": lambda: pool_rate(env_fn, "process", n, steps, 0.0),
        "process lockstep": lambda: pool_rate(env_fn, "process", n, steps, None),
        "gym-async": lambda: gym_async_rate(env_fn, n, steps),
    }
    rates = {name: max(measure() for _ in range(args.repeats))
             for name, measure in measures.items()}
    print(f"{n} workers, {args.load} {args.delay * 1e3:g} ms per step "
          f"(ideal: {n / args.delay:,.0f} steps/s with {n} parallel envs)")
    for name, rate in rates.items():
        print(f"  {name:17s} {rate:9,.0f} env steps/s   {rate / rates['sync']:5.2f}x sync")
    print(f"  process / gym-async: {rates['process'] / rates['gym-async']:.2f}x, "
          f"process lockstep / gym-async: {rates['process lockstep'] / rates['gym-async']:.2f}x, "
          f"thread / gym-async: {rates['thread'] / rates['gym-async']:.2f}x")


if __name__ == "__main__":
    main()
