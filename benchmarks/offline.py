"""Offline RL on a mixed-quality Pendulum-v1 dataset: BC, CQL and IQL against the expert.

Run: ``python benchmarks/offline.py [--dataset DIR] [--expert RUN_DIR] [--seeds 0 1 2]
[--steps N] [--hidden 256 256] [--algos bc cql iql] [--device cpu]
[--set cql.lr=1e-3 ...]``

Without ``--dataset`` it makes one: SAC trained on Pendulum-v1 for 20k env steps (the
expert), then 100 of its greedy episodes recorded with ``--epsilon 0.5`` (each action
uniformly random with probability 1/2). Each algorithm then trains ``--steps`` gradient
updates per seed on that same dataset, and its best policy (``best/``, the best of the
evaluations made every ``steps / 5`` updates) is evaluated afresh on 20 greedy episodes,
as the expert is. One JSON line per run is appended to ``benchmarks/offline_results.jsonl``
and a table printed: the mean over seeds, and each as a share of the expert's return
("within 15%": ``return >= expert - 0.15 |expert|``). Each ``--set ALGO.KEY=VALUE``
applies to that algorithm's runs and is written in their rows (``"sets"``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from rlloop.config.loading import build_config
from rlloop.runs.collect import collect
from rlloop.runs.saved import evaluate_run
from rlloop.runs.start import train

RESULTS = Path(__file__).with_name("offline_results.jsonl")
QUIET = ["mlflow=false", "progress=false", "save_video=false", "stop_on_solve=false"]


def expert_and_dataset(workdir: Path, expert: str | None, dataset: str | None
                       ) -> tuple[Path, Path]:
    """The SAC expert's run and the mixed dataset (made when not given)."""
    run = Path(expert) if expert else None
    if run is None:
        run = workdir / "expert-sac"
        if not (run / "best").is_dir():
            train(build_config("sac", "Pendulum-v1", flags={"seed": 0,
                                                              "total_env_steps": 20_000},
                               sets=QUIET), run)
    data = Path(dataset) if dataset else workdir / "pendulum-mixed"
    if not (data / "data").is_dir():
        collect(run, 100, data, epsilon=0.5, seed=1)
    return run, data


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dataset")
    p.add_argument("--expert")
    p.add_argument("--workdir", default="runs/offline-bench")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=30_000)
    p.add_argument("--hidden", type=int, nargs="+", default=[256, 256])
    p.add_argument("--algos", nargs="+", default=["bc", "iql", "cql"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--set", dest="sets", action="append", default=[],
                   help="ALGO.KEY=VALUE for that algorithm's runs (repeatable)")
    args = p.parse_args()
    workdir = Path(args.workdir)
    expert, dataset = expert_and_dataset(workdir, args.expert, args.dataset)
    expert_return = evaluate_run(expert, 20)["return_mean"]
    print(f"expert {expert}: {expert_return:.1f} (20 greedy episodes); dataset {dataset}")
    returns: dict[str, list[float]] = {}
    for algo in args.algos:
        for seed in args.seeds:
            t0 = time.perf_counter()
            sets = [s for s in args.sets if s.startswith(f"{algo}.")]
            config = build_config(algo, "Pendulum-v1", flags={"seed": seed,
                                                                "device": args.device},
                                  sets=[*QUIET, f"{algo}.dataset={dataset}",
                                        f"{algo}.total_gradient_steps={args.steps}",
                                        f"{algo}.eval_interval={max(args.steps // 5, 1)}",
                                        f"{algo}.hidden={json.dumps(args.hidden)}",
                                        *sets])
            run = workdir / f"{algo}-{seed}-{int(time.time())}"
            train(config, run)
            value = evaluate_run(run, 20)["return_mean"]
            returns.setdefault(algo, []).append(value)
            row = {"algo": algo, "seed": seed, "steps": args.steps, "hidden": args.hidden,
                   "sets": sets, "return_mean": value, "expert": expert_return,
                   "dataset": dataset.name,
                   "wall_s": round(time.perf_counter() - t0, 1)}
            with RESULTS.open("a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")
            print(json.dumps(row), flush=True)
    print(f"{'algo':5s} {'mean':>8s}  per seed  (expert {expert_return:.1f}; within 15%: >= "
          f"{expert_return - 0.15 * abs(expert_return):.1f})")
    for algo, values in returns.items():
        print(f"{algo:5s} {statistics.mean(values):8.1f}  "
              + " ".join(f"{v:.1f}" for v in values))


if __name__ == "__main__":
    main()
