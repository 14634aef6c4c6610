"""Discrete CQL's penalty weight on a mixed-quality CartPole-v1 dataset: CQL at each weight
against BC, on the same data.

Run: ``python benchmarks/offline_cartpole.py [--workdir DIR] [--seeds 0 1 2] [--steps N]
[--weights 1 10] [--hidden 64 64] [--no-bc] [--threads 1]``

The dataset (made once per ``--workdir``) mixes two policies of different quality, as
``rlloop collect`` records them: a PPO expert (trained until it solves CartPole-v1) playing
greedily, and an early PPO policy (``--early-steps`` env steps of training) with each action
uniformly random with probability ``--epsilon``; ``--episodes`` of each (10 and 100). Their
episodes are written together as one Minari dataset. Uniform noise alone would not do:
with Discrete actions the noisy expert's most frequent action at a state is still the
expert's, so BC would recover the expert; the early policy's own greedy choices are what
BC cannot tell from the expert's.

BC and CQL (one run per ``--weights`` value of ``cql.cql_weight``) then train ``--steps``
gradient updates per seed, evaluated every ``steps / 5``; each best policy (``best/``) is
evaluated afresh on 20 greedy episodes. One JSON line per run is appended to
``benchmarks/offline_results.jsonl`` (``"dataset": "cartpole-mixed-..."``, with the CPU
seconds of the run) and a table of the means printed. The offline guide's table is
``--weights 0 1 10`` (seeds 0-2), then ``--seeds 3 4 5 --weights 1 10 --no-bc``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

from rlloop.config.loading import build_config
from rlloop.data.offline_dataset import Episode, open_minari, write_minari
from rlloop.runs.collect import collect
from rlloop.runs.saved import evaluate_run
from rlloop.runs.start import train

RESULTS = Path(__file__).with_name("offline_results.jsonl")
QUIET = ["mlflow=false", "progress=false", "save_video=false", "stop_on_solve=false"]


def _episodes(dataset: Path) -> list[Episode]:
    return [Episode(np.asarray(e.observations), np.asarray(e.actions, np.int64),
                    np.asarray(e.rewards), np.asarray(e.terminations),
                    np.asarray(e.truncations)) for e in open_minari(str(dataset))]


def mixed_dataset(workdir: Path, early_steps: int, episodes: tuple[int, int], epsilon: float
                  ) -> tuple[Path, dict[str, float]]:
    """The expert, the early policy, their datasets (``episodes``: the expert's, the early
    policy's) and the mixed one, each made when missing; returns the mixed dataset and the
    mean episode return of each part."""
    runs = {"expert": (workdir / "expert-ppo", ["stop_on_solve=true"], episodes[0]),
            "early": (workdir / f"early-ppo-{early_steps}", [f"total_env_steps={early_steps}"],
                      episodes[1])}
    returns: dict[str, float] = {}
    parts = []
    for name, (run, sets, count) in runs.items():
        if not (run / "checkpoints").is_dir():
            train(build_config("ppo", "CartPole-v1", flags={"seed": 0},
                               sets=[*QUIET, *sets]), run)
        noise = 0.0 if name == "expert" else epsilon
        data = workdir / f"cartpole-{name}-{count}-{noise}"
        if not (data / "data").is_dir():
            collect(run, count, data, epsilon=noise, seed=1)
        recorded = _episodes(data)
        returns[name] = float(np.mean([e.rewards.sum() for e in recorded]))
        parts += recorded
    mixed = workdir / f"cartpole-mixed-{early_steps}-{episodes[0]}-{episodes[1]}-{epsilon}"
    if not (mixed / "data").is_dir():
        write_minari(mixed, parts, "CartPole-v1", description=(
            f"{episodes[0]} greedy episodes of a PPO expert and {episodes[1]} of an early "
            f"PPO policy ({early_steps} env steps) with epsilon={epsilon}"))
    return mixed, returns


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workdir", default="runs/offline-cartpole-bench")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=3_000)
    p.add_argument("--weights", type=float, nargs="+", default=[1.0, 10.0])
    p.add_argument("--hidden", type=int, nargs="+", default=[64, 64])
    p.add_argument("--early-steps", type=int, default=1_024)
    p.add_argument("--episodes", type=int, nargs=2, default=[10, 100],
                   help="the expert's and the early policy's")
    p.add_argument("--epsilon", type=float, default=0.3)
    p.add_argument("--bc", action=argparse.BooleanOptionalAction, default=True,
                   help="train BC too (--no-bc: CQL only)")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    workdir = Path(args.workdir)
    dataset, parts = mixed_dataset(workdir, args.early_steps, tuple(args.episodes),
                                   args.epsilon)
    print(f"dataset {dataset}: mean episode return {parts}")
    runs = [("bc", [])] * args.bc + [("cql", [f"cql.cql_weight={w}"]) for w in args.weights]
    returns: dict[str, list[float]] = {}
    for algo, sets in runs:
        label = " ".join([algo, *sets])
        for seed in args.seeds:
            t0, c0 = time.perf_counter(), time.process_time()
            config = build_config(algo, "CartPole-v1", flags={"seed": seed, "device": "cpu"},
                                  sets=[*QUIET, f"{algo}.dataset={dataset}",
                                        f"{algo}.total_gradient_steps={args.steps}",
                                        f"{algo}.eval_interval={max(args.steps // 5, 1)}",
                                        f"{algo}.hidden={json.dumps(args.hidden)}", *sets])
            tag = "-".join([algo, *(s.split("=")[1] for s in sets), str(seed)])
            run = workdir / dataset.name / f"{tag}-{int(time.time())}"
            train(config, run)
            value = evaluate_run(run, 20)["return_mean"]
            returns.setdefault(label, []).append(value)
            row = {"algo": algo, "seed": seed, "steps": args.steps, "hidden": args.hidden,
                   "sets": sets, "return_mean": value, "dataset": dataset.name,
                   "parts": parts, "wall_s": round(time.perf_counter() - t0, 1),
                   "cpu_s": round(time.process_time() - c0, 1)}
            with RESULTS.open("a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")
            print(json.dumps(row), flush=True)
    print(f"dataset parts: {parts}")
    for label, values in returns.items():
        print(f"{label:20s} {statistics.mean(values):8.1f}  "
              + " ".join(f"{v:.1f}" for v in values))


if __name__ == "__main__":
    main()
