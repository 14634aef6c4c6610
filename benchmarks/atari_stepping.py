"""Raw Atari env stepping: env steps/s of rlloop's env backends on random actions.

Run: ``python benchmarks/atari_stepping.py [--env ALE/Breakout-v5] [--num-envs 8]
[--steps 2000] [--rounds 3] [--backends gymnasium envpool] [--clock wall|cpu] [--json]``

Each backend builds ``make_env(env, num_envs, backend=...)`` with the same preprocessing
(no-op reset, frame skip 4, episodic life, fire reset, 84x84 grayscale, 4 stacked uint8
frames, sticky actions 0.25), resets, steps 100 untimed batches, then times ``--steps``
batches of uniformly random actions (drawn before timing). Backends alternate for
``--rounds`` rounds so that all see the same machine load; each one's fastest round is
reported (env steps = batches x envs) with the 1-minute load average around it. No learning:
this is the env side alone (what a learner could get at most from the backend).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from rlloop.envs.registry import make_env

WARMUP = 100


def measure(env_id: str, backend: str, num_envs: int, steps: int, clock: str) -> float:
    """Env steps per second (wall or process CPU seconds) of one backend's timed steps."""
    env = make_env(env_id, num_envs, backend=backend, seed=0)
    try:
        n = int(env.spec.action_space.n)  # type: ignore[union-attr]
        actions = torch.randint(n, (WARMUP + steps, num_envs),
                                generator=torch.Generator().manual_seed(0))
        env.reset()
        for t in range(WARMUP):
            env.step(actions[t])
        now = time.process_time if clock == "cpu" else time.perf_counter
        start = now()
        for t in range(WARMUP, WARMUP + steps):
            env.step(actions[t])
        return steps * num_envs / (now() - start)
    finally:
        env.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="ALE/Breakout-v5")
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--steps", type=int, default=2000, help="timed batches per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backends", nargs="+", default=["gymnasium", "envpool"])
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    best: dict[str, float] = {}
    for _ in range(args.rounds):
        for backend in args.backends:
            rate = measure(args.env, backend, args.num_envs, args.steps, args.clock)
            best[backend] = max(best.get(backend, 0.0), rate)
    load = os.getloadavg()[0]
    rows = [{"backend": b, "env_steps_per_s": round(r), "num_envs": args.num_envs,
             "clock": args.clock, "load_1min": round(load, 2)} for b, r in best.items()]
    if args.json:
        print(json.dumps(rows))
        return
    print(f"{args.env}, {args.num_envs} envs, random actions, {args.clock} clock, "
          f"load {load:.2f}")
    for row in rows:
        print(f"  {row['backend']:<18} {row['env_steps_per_s']:>8} env steps/s")


if __name__ == "__main__":
    main()
