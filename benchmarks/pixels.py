"""Atari throughput: rlloop's PPO and DQN against Stable-Baselines3 on Breakout.

Run: ``python benchmarks/pixels.py [--algos ppo dqn] [--ppo-iters 2] [--dqn-steps 4000]
[--rounds 2] [--threads 1] [--device cpu] [--cnn-precision float32 bfloat16] [--json]``

Both libraries train on the same envs: rlloop's Atari preprocessing
(:func:`rlloop.envs.atari.make_atari`: no-op reset, frame skip 4, episodic life, fire
reset, 84x84 grayscale, 4 stacked uint8 frames), SB3's side wrapping the very same
Gymnasium envs in its ``DummyVecEnv``. The hyperparameters are rl-zoo's Atari ones (the
presets of ``ALE/Breakout-v5``): PPO with 8 envs x 128 steps, 4 epochs of minibatches of
256, Nature CNN; DQN with one env, an update of batch 32 every 4 env steps, a target copy
every 1000 env steps. Only the replay capacity (``--buffer``, 20,000) and ``learning_starts``
(1,000) are smaller, so that the measured steps include updates and SB3's replay (which
stores every observation twice, 56 KB per transition) fits the machine.

Each measurement builds a fresh agent, runs one untimed warm-up (a PPO iteration; DQN's
warm-up and first updates), then times the env steps that follow, learning included.
rlloop and SB3 alternate for ``--rounds`` rounds so that both see the same machine load;
each one's fastest round is reported with the 1-minute load average around it.
``--cnn-precision`` lists rlloop's contenders by the Nature CNN's precision
(``<algo>.cnn_precision``; ``bfloat16`` is reported as ``rlloop-bf16``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from rlloop.config.loading import build_config
from rlloop.envs.atari import make_atari
from rlloop.envs.ids import resolve_env_id
from rlloop.runs.build import build_algorithm

ENV = "ALE/Breakout-v5"
QUIET = ["mlflow=false", "progress=false", "save_video=false"]


@dataclass(frozen=True)
class Measurement:
    library: str
    algo: str
    env_steps: int
    seconds: float
    load: float

    @property
    def env_sps(self) -> float:
        return self.env_steps / self.seconds


def _timed(library: str, algo: str, fn: Any) -> Measurement:
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    steps = fn()
    seconds = time.perf_counter() - t0
    return Measurement(library, algo, steps, seconds, (load + os.getloadavg()[0]) / 2)


# ---------------------------------------------------------------- rlloop


def _label(precision: str) -> str:
    return "rlloop" if precision == "float32" else "rlloop-bf16"


def rlloop_ppo(iters: int, device: str, precision: str = "float32") -> Measurement:
    algo = build_algorithm(build_config("ppo", ENV, flags={"seed": 0, "device": device},
                                        sets=[*QUIET, f"ppo.cnn_precision={precision}"]))
    try:
        steps = int(algo.collect()["env/steps"])
        algo.update(steps)

        def run() -> int:
            nonlocal steps
            start = steps
            for _ in range(iters):
                steps += int(algo.collect()["env/steps"])
                algo.update(steps)
            return steps - start

        return _timed(_label(precision), "ppo", run)
    finally:
        algo.close()


def rlloop_dqn(env_steps: int, buffer: int, device: str, precision: str = "float32"
               ) -> Measurement:
    algo = build_algorithm(build_config(
        "dqn", ENV, flags={"seed": 0, "device": device},
        sets=[*QUIET, f"dqn.buffer_size={buffer}", "dqn.learning_starts=1000",
              f"dqn.cnn_precision={precision}"]))
    try:
        steps = 0
        while steps < 1200:  # warm-up and the first updates, untimed
            steps += int(algo.collect()["env/steps"])
            algo.update(steps)

        def run() -> int:
            nonlocal steps
            start = steps
            while steps - start < env_steps:
                steps += int(algo.collect()["env/steps"])
                algo.update(steps)
            return steps - start

        return _timed(_label(precision), "dqn", run)
    finally:
        algo.close()


# ---------------------------------------------------------------- SB3


def _sb3_env(num_envs: int) -> Any:
    from stable_baselines3.common.vec_env import DummyVecEnv

    env_id = resolve_env_id(ENV)
    return DummyVecEnv([lambda: make_atari(env_id)] * num_envs)


def sb3_ppo(iters: int, device: str) -> Measurement:
    from stable_baselines3 import PPO

    env = _sb3_env(8)
    model = PPO("CnnPolicy", env, n_steps=128, n_epochs=4, batch_size=256,
                learning_rate=2.5e-4, clip_range=0.1, vf_coef=0.5, ent_coef=0.01,
                device=device, seed=0, verbose=0)
    model.learn(1024)  # one iteration, untimed
    try:
        return _timed("sb3", "ppo", lambda: (model.learn(iters * 1024,
                                                         reset_num_timesteps=False),
                                             iters * 1024)[1])
    finally:
        env.close()


def sb3_dqn(env_steps: int, buffer: int, device: str) -> Measurement:
    from stable_baselines3 import DQN

    env = _sb3_env(1)
    model = DQN("CnnPolicy", env, buffer_size=buffer, learning_rate=1e-4, batch_size=32,
                learning_starts=1000, target_update_interval=1000, train_freq=4,
                gradient_steps=1, exploration_fraction=0.1, exploration_final_eps=0.01,
                device=device, seed=0, verbose=0)
    model.learn(1200)
    try:
        return _timed("sb3", "dqn", lambda: (model.learn(env_steps, reset_num_timesteps=False),
                                             env_steps)[1])
    finally:
        env.close()


def _flushing(enabled: bool, run: Callable[[], Measurement]) -> Measurement:
    from rlloop.system.numerics import flushed_denormals

    with flushed_denormals(enabled):
        return run()


def main(argv: list[str] | None = None) -> list[Measurement]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algos", nargs="+", default=["ppo", "dqn"], choices=["ppo", "dqn"])
    parser.add_argument("--ppo-iters", type=int, default=2)
    parser.add_argument("--dqn-steps", type=int, default=4000)
    parser.add_argument("--buffer", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--cnn-precision", nargs="+", default=["float32"],
                        choices=["float32", "bfloat16"])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--sb3-flush", choices=("on", "off"), default="on",
                        help="SB3 flushes subnormal floats to zero as rlloop's trainer does "
                             "(on, like for like) or runs at torch's default (off)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    runs: dict[str, dict[str, Any]] = {"ppo": {}, "dqn": {}}
    for precision in args.cnn_precision:
        runs["ppo"][_label(precision)] = (
            lambda p=precision: rlloop_ppo(args.ppo_iters, args.device, p))
        runs["dqn"][_label(precision)] = (
            lambda p=precision: rlloop_dqn(args.dqn_steps, args.buffer, args.device, p))
    # rlloop's trainer flushes subnormal floats to zero (its flush_denormal default); SB3
    # trains under the same mode unless --sb3-flush off (its own defaults).
    flush = args.sb3_flush == "on"
    runs["ppo"]["sb3"] = lambda: _flushing(flush, lambda: sb3_ppo(args.ppo_iters, args.device))
    runs["dqn"]["sb3"] = lambda: _flushing(flush, lambda: sb3_dqn(args.dqn_steps, args.buffer,
                                                                   args.device))
    results: list[Measurement] = []
    for algo in args.algos:
        best: dict[str, Measurement] = {}
        for _ in range(args.rounds):
            for library, run in runs[algo].items():
                m = run()
                if library not in best or m.env_sps > best[library].env_sps:
                    best[library] = m
        results += best.values()
        s = best["sb3"]
        for label, r in best.items():
            if label != "sb3" and not args.json:
                print(f"{algo}: {label} {r.env_sps:7.1f} env/s (load {r.load:.1f}), "
                      f"sb3 {s.env_sps:7.1f} env/s (load {s.load:.1f}), "
                      f"ratio {r.env_sps / s.env_sps:.2f}x", flush=True)
    if args.json:
        print(json.dumps([{**asdict(m), "env_sps": m.env_sps} for m in results]))
    return results


if __name__ == "__main__":
    main()
