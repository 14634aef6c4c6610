"""Whole-process races on a CPU: rlloop's default path against SBX (and optionally SB3).

Run: ``python benchmarks/whole_process.py [--rows dqn sac td3 ppo] [--dqn-steps N]
[--sac-steps N] [--td3-steps N] [--rounds 2] [--seed 0] [--sb3] [--one-core]`` (also reached as
``python benchmarks/offpolicy.py --whole-process ...``).

Each run is a fresh Python process, timed from its start to its end by the wall clock:
imports, building, any compilation (SBX jit-compiles its updates in every new process:
JAX keeps no compilation cache on disk by default) and training. Its own evaluation
(20 deterministic Gymnasium episodes after training; PPO's evaluations every 2560 env
steps until one reaches 475) is timed inside the process and left out. The contenders of a
row alternate run by run, ``--rounds`` times, so all see the same machine load; the load
average is printed with each run. Reported per run: ``whole s`` (the process minus its
evaluations), ``CPU s`` (the process's CPU time, every thread, user and system, minus its
evaluations': steadier than the wall clock on a loaded machine), ``train s`` (the
training loop alone, from the first env step), ``steady`` (env steps per second over the
budget's second half, after any compilation; and per CPU second of the process over the
same half, all its threads), the return.

Everything runs on one thread: torch's (``torch.set_num_threads(1)``) and XLA's CPU client
(``XLA_FLAGS=--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1``, set
before jax is imported; see ``jax_peer.py``). Even so, SBX's XLA runtime keeps about 1.5
cores busy while it trains (its CPU seconds exceed its wall seconds), so on a machine with
a second core free its wall clock gains from it; ``--one-core`` confines every run to one
core (``sched_setaffinity`` before it starts), so that each wall clock is one core's.
Hyperparameters are rl-zoo's, as in
``offpolicy.py`` (DQN CartPole-v1: SBX one Gymnasium env; rlloop one native env, rl-zoo's
setup, and four, its preset) and ``ppo_cartpole.py`` (rlloop's CartPole preset against
SBX at rl-zoo's CartPole entry, the time to a 475 evaluation). TD3 on Pendulum-v1 takes
rlloop's preset (rl-zoo's entry, learning from 1000 steps) for both.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
EVAL_EPISODES = 20
#: Contenders per algorithm: (label, library, rlloop num_envs).
CONTENDERS: dict[str, tuple[tuple[str, str, int], ...]] = {
    "dqn": (("rlloop 1 env", "rlloop", 1), ("rlloop 4 envs (preset)", "rlloop", 4),
            ("sbx 1 env", "sbx", 1)),
    "sac": (("rlloop", "rlloop", 1), ("sbx", "sbx", 1)),
    "td3": (("rlloop", "rlloop", 1), ("sbx", "sbx", 1)),
    "ppo": (("rlloop native (preset)", "rlloop", 16), ("sbx (rl-zoo)", "sbx", 8)),
}
ENV_IDS = {"dqn": "CartPole-v1", "sac": "Pendulum-v1", "td3": "Pendulum-v1",
           "ppo": "CartPole-v1"}


@dataclass
class Run:
    label: str
    algo: str
    steps: int
    whole_s: float
    cpu_s: float
    train_s: float
    steady_sps: float
    steady_cpu_sps: float
    eval_return: float
    load: float


# ---------------------------------------------------------------- child: one run


def child(library: str, algo: str, steps: int, seed: int, num_envs: int) -> dict[str, float]:
    """One run in this process; what the parent reads back."""
    import torch

    torch.set_num_threads(1)
    if algo == "ppo":
        return child_ppo(library, steps, seed)
    sys.path.insert(0, str(HERE))
    from offpolicy import evaluate_gym

    half = steps // 2
    if library == "rlloop":
        from offpolicy import RlloopRun

        run = RlloopRun(algo, ENV_IDS[algo], steps, seed, num_envs)
        t0 = time.perf_counter()
        run.advance(half)
        t_half, c_half, at_half = (time.perf_counter(), time.process_time(),
                                   run.trainer.state["env/steps"])
        run.advance(steps)
        t1, c1, done = time.perf_counter(), time.process_time(), run.trainer.state["env/steps"]
        act = run.act
    else:
        model = peer_model(library, algo, seed)
        marks: list[tuple[float, float, int]] = []
        t0 = time.perf_counter()
        model.learn(total_timesteps=steps, callback=half_mark(half, marks))
        t1, c1, done = time.perf_counter(), time.process_time(), int(model.num_timesteps)
        t_half, c_half, at_half = marks[0]

        def act(obs):  # type: ignore[no-untyped-def]
            action, _ = model.predict(obs, deterministic=True)
            return int(action) if algo == "dqn" else action

    e0, c0 = time.perf_counter(), time.process_time()
    ret = evaluate_gym(ENV_IDS[algo], act, EVAL_EPISODES)
    return {"train_s": t1 - t0, "steady_sps": (done - at_half) / (t1 - t_half),
            "steady_cpu_sps": (done - at_half) / (c1 - c_half),
            "eval_s": time.perf_counter() - e0, "eval_cpu_s": time.process_time() - c0,
            "return": ret}


def peer_model(library: str, algo: str, seed: int):  # type: ignore[no-untyped-def]
    if library == "sbx":
        from jax_peer import sbx_model

        return sbx_model(algo, ENV_IDS[algo], seed)
    from offpolicy import sb3_model

    return sb3_model(algo, ENV_IDS[algo], seed)


def half_mark(half: int, marks: list[tuple[float, float, int]]):  # type: ignore[no-untyped-def]
    """An SB3 callback noting ``(wall time, CPU time, env steps)`` when training passes
    ``half``."""
    from stable_baselines3.common.callbacks import BaseCallback

    class HalfMark(BaseCallback):
        def _on_step(self) -> bool:
            if not marks and self.num_timesteps >= half:
                marks.append((time.perf_counter(), time.process_time(), self.num_timesteps))
            return True

    return HalfMark()


def child_ppo(library: str, budget: int, seed: int) -> dict[str, float]:
    """PPO CartPole-v1 until a 475 evaluation (``ppo_cartpole.py``'s protocol)."""
    sys.path.insert(0, str(HERE))
    import ppo_cartpole as pc

    if library == "rlloop":
        out = pc.run_rlloop(seed, "native", budget, 2560, EVAL_EPISODES)
    else:
        out = pc.run_sbx(seed, budget, 2560, EVAL_EPISODES)
    return {"train_s": out.solve_s, "steady_sps": out.train_sps,
            "steady_cpu_sps": out.train_sps,
            "eval_s": out.solve_total_s - out.solve_s, "return": out.final_eval,
            "solve_steps": out.solve_steps}


# ---------------------------------------------------------------- parent: the race


def run_child(library: str, algo: str, steps: int, seed: int, num_envs: int,
              core: int | None = None) -> tuple[float, float, dict[str, float]]:
    """Run one child (confined to CPU ``core`` if given): its wall seconds, its CPU
    seconds (all threads, user + system) and what it reported."""
    from jax_peer import ONE_THREAD_XLA_FLAGS

    env = {**os.environ, "XLA_FLAGS": ONE_THREAD_XLA_FLAGS, "JAX_PLATFORMS": "cpu",
           "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", library, algo,
           str(steps), str(seed), str(num_envs)]
    cpu0 = _children_cpu()
    t0 = time.perf_counter()
    pin = None if core is None else (lambda: os.sched_setaffinity(0, {core}))
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, preexec_fn=pin)
    wall = time.perf_counter() - t0
    cpu = _children_cpu() - cpu0
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{library} {algo} failed:\n{proc.stderr[-3000:]}")
    return wall, cpu, json.loads(lines[-1][len("RESULT "):])


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def race(algo: str, steps: int, rounds: int, seed: int, sb3: bool,
         core: int | None = None) -> list[Run]:
    contenders = list(CONTENDERS[algo])
    if sb3 and algo in ("dqn", "sac"):
        contenders.append(("sb3 1 env", "sb3", 1))
    runs: list[Run] = []
    for rnd in range(rounds):
        # alternate the order each round, so neither always runs first
        for label, library, n in (contenders if rnd % 2 == 0 else contenders[::-1]):
            load = os.getloadavg()[0]
            wall, cpu, out = run_child(library, algo, steps, seed, n, core)
            run = Run(label, algo, int(out.get("solve_steps", steps)), wall - out["eval_s"],
                      cpu - out.get("eval_cpu_s", out["eval_s"]), out["train_s"],
                      out["steady_sps"], out["steady_cpu_sps"], out["return"], load)
            runs.append(run)
            print(f"{algo} {steps} round {rnd}: {label:24s} whole {run.whole_s:7.1f} s "
                  f"(CPU {run.cpu_s:7.1f} s), train "
                  f"{run.train_s:7.1f} s, steady {run.steady_sps:8.1f} env/s (per CPU s "
                  f"{run.steady_cpu_sps:8.1f}), return "
                  f"{run.eval_return:7.1f}, load {load:.1f}", flush=True)
    return runs


def report(runs: list[Run]) -> None:
    """Per row: each contender's runs, and rlloop's ratios to SBX (SBX time / rlloop
    time, and steady rates rlloop / SBX: above 1 is rlloop faster)."""
    print(f"\n{'row':16s} {'contender':24s} {'whole s':>16s} {'CPU s':>16s} {'train s':>16s} "
          f"{'steady env/s':>18s} {'per CPU s':>18s} {'return':>14s}")
    for algo, steps in dict.fromkeys((r.algo, r.steps if r.algo != "ppo" else 0)
                                     for r in runs):
        row = [r for r in runs if r.algo == algo and (algo == "ppo" or r.steps == steps)]
        name = f"{algo} {steps // 1000}k" if algo != "ppo" else "ppo to 475"
        for label in dict.fromkeys(r.label for r in row):
            cells = [", ".join(f"{getattr(r, field):.1f}" for r in row if r.label == label)
                     for field in ("whole_s", "cpu_s", "train_s", "steady_sps", "steady_cpu_sps",
                                   "eval_return")]
            print(f"{name:16s} {label:24s} {cells[0]:>16s} {cells[1]:>16s} {cells[2]:>16s} "
                  f"{cells[3]:>18s} {cells[4]:>18s} {cells[5]:>14s}")
        peer = [r for r in row if r.label.startswith("sbx")]
        for label in dict.fromkeys(r.label for r in row if r.label.startswith("rlloop")):
            mine = [r for r in row if r.label == label]
            pairs = list(zip(mine, peer, strict=False))
            ratios = {"whole process": [p.whole_s / m.whole_s for m, p in pairs],
                      "CPU": [p.cpu_s / m.cpu_s for m, p in pairs],
                      "steady": [m.steady_sps / p.steady_sps for m, p in pairs],
                      "steady per CPU s": [m.steady_cpu_sps / p.steady_cpu_sps for m, p in pairs]}
            print(f"{name:16s} {label:24s} vs SBX: " + "; ".join(
                f"{what} " + ", ".join(f"{x:.2f}x" for x in xs) for what, xs in ratios.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", nargs="+", choices=list(CONTENDERS), default=list(CONTENDERS))
    parser.add_argument("--dqn-steps", type=int, nargs="+", default=[40_000])
    parser.add_argument("--sac-steps", type=int, nargs="+", default=[3_000, 20_000])
    parser.add_argument("--td3-steps", type=int, nargs="+", default=[3_000, 20_000])
    parser.add_argument("--ppo-budget", type=int, default=200_000,
                        help="PPO's env-step cap if no evaluation reaches 475")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sb3", action="store_true", help="add SB3 to the DQN and SAC rows")
    parser.add_argument("--one-core", action="store_true",
                        help="confine every run to one CPU core (its wall clock is then one "
                             "core's, whatever threads it starts)")
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        library, algo, steps, seed, n = args.child
        out = child(library, algo, int(steps), int(seed), int(n))
        # the cores it may run on (1 under --one-core)
        print("RESULT " + json.dumps({**out, "cores": len(os.sched_getaffinity(0))}))
        return
    sys.path.insert(0, str(HERE))
    from jax_peer import require_sbx

    require_sbx()  # fail here, not in the first child
    budgets = {"dqn": args.dqn_steps, "sac": args.sac_steps, "td3": args.td3_steps,
               "ppo": [args.ppo_budget]}
    core = max(os.sched_getaffinity(0)) if args.one_core else None
    runs = [r for algo in args.rows for steps in budgets[algo]
            for r in race(algo, steps, args.rounds, args.seed, args.sb3, core)]
    report(runs)


if __name__ == "__main__":
    main()
