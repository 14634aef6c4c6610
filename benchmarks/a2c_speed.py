"""A2C training throughput on CartPole-v1: rlloop vs Stable-Baselines3, in one process.

Run: ``python benchmarks/a2c_speed.py [--steps 200000] [--chunk 10000] [--seed 0]``

Every contender trains with the same hyperparameters: rl-zoo's ``hyperparams/a2c.yml``
CartPole-v1 entry, which is SB3's A2C defaults with 8 envs (5 steps per env, one RMSprop
step per 40-step rollout, lr 7e-4, gamma 0.99, gae_lambda 1, max_grad_norm 0.5, [64, 64]
tanh actor and critic) and is rlloop's shipped preset. Contenders:

- ``rlloop native``: rlloop's batched torch CartPole (its default backend for this env);
- ``rlloop gymnasium``: Gymnasium's CartPole, the env SB3 steps;
- ``sb3``: ``A2C("MlpPolicy", make_vec_env("CartPole-v1", n_envs=8))``.

The runs take turns every ``--chunk`` env steps, so all of them see the same machine load,
and each clock runs only during its own training (no evaluation). Reported per contender:
env steps per second of wall time and of this process's CPU time (the CPU figure is the
fairer one on a shared machine), and each rlloop contender's ratio to SB3. Everything runs
with one torch thread (for these small MLPs more threads do not help).
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class Contender:
    """A training run advanced ``advance(target)`` up to ``target`` env steps at a time."""

    name: str
    advance: Callable[[int], int]
    close: Callable[[], None]
    steps: int = 0
    wall_s: float = 0.0
    cpu_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def run_to(self, target: int) -> None:
        t0, c0 = time.perf_counter(), time.process_time()
        self.steps = self.advance(target)
        self.wall_s += time.perf_counter() - t0
        self.cpu_s += time.process_time() - c0


def rlloop_contender(name: str, backend: str, seed: int) -> Contender:
    from rlloop.config.loading import build_config
    from rlloop.runs.build import build_algorithm
    from rlloop.trainers.loop import Trainer

    config = build_config(
        "a2c",
        "CartPole-v1",
        flags={"seed": seed, "backend": backend},
        sets=["mlflow=false", "progress=false"],
    )
    algo = build_algorithm(config)
    trainer = Trainer(algo)

    def advance(target: int) -> int:
        while trainer.state["env/steps"] < target:
            trainer.step()
        return trainer.state["env/steps"]

    return Contender(name, advance, algo.close)


def sb3_contender(seed: int) -> Contender:
    from stable_baselines3 import A2C
    from stable_baselines3.common.env_util import make_vec_env

    env = make_vec_env("CartPole-v1", n_envs=8, seed=seed)
    model = A2C("MlpPolicy", env, ent_coef=0.0, seed=seed, device="cpu", verbose=0)

    def advance(target: int) -> int:
        if target > model.num_timesteps:
            model.learn(total_timesteps=target - model.num_timesteps, reset_num_timesteps=False)
        return int(model.num_timesteps)

    return Contender("sb3", advance, env.close)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200_000, help="env steps per contender")
    parser.add_argument(
        "--chunk",
        type=int,
        default=10_000,
        help="env steps a contender trains before the next takes its turn",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    contenders = [
        rlloop_contender("rlloop native", "native", args.seed),
        rlloop_contender("rlloop gymnasium", "gymnasium", args.seed),
        sb3_contender(args.seed),
    ]
    try:
        for target in range(args.chunk, args.steps + args.chunk, args.chunk):
            for c in contenders:
                c.run_to(min(target, args.steps))
    finally:
        for c in contenders:
            c.close()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"A2C CartPole-v1, 8 envs x 5 steps, {args.steps:,} env steps each "
        f"(seed {args.seed}, load average {load:.1f})"
    )
    print(
        f"{'contender':18s} {'env steps':>10s} {'wall s':>8s} {'cpu s':>8s} "
        f"{'steps/s':>9s} {'steps/cpu-s':>12s}"
    )
    for c in contenders:
        print(
            f"{c.name:18s} {c.steps:>10,d} {c.wall_s:>8.1f} {c.cpu_s:>8.1f} "
            f"{c.steps / c.wall_s:>9,.0f} {c.steps / c.cpu_s:>12,.0f}"
        )
    sb3 = contenders[-1]
    for c in contenders[:-1]:
        print(
            f"{c.name} / sb3: {(c.steps / c.wall_s) / (sb3.steps / sb3.wall_s):.1f}x wall, "
            f"{(c.steps / c.cpu_s) / (sb3.steps / sb3.cpu_s):.1f}x cpu"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
