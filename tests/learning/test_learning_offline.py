"""CQL and IQL learn from a mixed-quality dataset: on 100 Pendulum-v1 episodes of a SAC
expert in which half the actions are uniformly random, both beat behaviour cloning on the
same data and come within 15% of the expert's return, over 3 seeds (the mean).

Heavy: the expert alone is 20k env steps of SAC, and each offline run 10k gradient updates
(``benchmarks/offline.py`` runs the same comparison with its budget as an argument).
"""

from __future__ import annotations

import statistics

import pytest

from rlloop.config.loading import build_config
from rlloop.runs.collect import collect
from rlloop.runs.saved import evaluate_run
from rlloop.runs.start import train

QUIET = ["mlflow=false", "progress=false", "save_video=false", "stop_on_solve=false"]
SEEDS = (0, 1, 2)


@pytest.fixture(scope="module")
def pendulum_mixed(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("offline-learning")
    expert = train(build_config("sac", "Pendulum-v1", flags={"seed": 0,
                                                               "total_env_steps": 20_000},
                                sets=QUIET), root / "sac").run_dir
    dataset = collect(expert, 100, root / "pendulum-mixed", epsilon=0.5, seed=1).path
    return root, dataset, evaluate_run(expert, 20)["return_mean"]


def _mean_return(root, dataset, algo: str) -> float:
    values = []
    for seed in SEEDS:
        config = build_config(algo, "Pendulum-v1", flags={"seed": seed}, sets=[
            *QUIET, f"{algo}.dataset={dataset}", f"{algo}.total_gradient_steps=10000",
            f"{algo}.eval_interval=2000", f"{algo}.hidden=[64,64]"])
        run = train(config, root / f"{algo}-{seed}").run_dir
        values.append(evaluate_run(run, 20)["return_mean"])
    return statistics.mean(values)


@pytest.mark.slow
@pytest.mark.heavy
def test_cql_and_iql_beat_bc_and_come_within_15_percent_of_the_expert(pendulum_mixed):
    root, dataset, expert = pendulum_mixed
    bc, cql, iql = (_mean_return(root, dataset, algo) for algo in ("bc", "cql", "iql"))
    bar = expert - 0.15 * abs(expert)
    assert cql > bc and iql > bc, (bc, cql, iql, expert)
    assert cql >= bar and iql >= bar, (bc, cql, iql, expert)
