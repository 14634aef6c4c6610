"""Multi-agent PPO on PettingZoo tic-tac-toe: self-play against a random player.

Run: ``python benchmarks/multi_agent.py [--seeds 0 1 2] [--budget 100000]
[--eval-every 10000] [--games 400] [--results multi_agent_results.jsonl]``

Each seed trains ``ma_ppo`` with the shipped tic-tac-toe preset (one module shared by both
players, 16 envs x 32 moves a rollout). Before training and every ``--eval-every`` env
steps (moves), the policy plays ``--games`` games as a focal player, its greedy move each
turn (as ``rlloop eval`` plays), against uniformly random legal moves, seats alternating
game by game; its score is wins minus losses per game, in [-1, 1]. The reference is a
random focal player against the same random opponent over as many games (about 0:
first-move luck cancels over the seats), measured once per seed. No published score is
compared: none measures this, so the random player is the bar (perfect play never loses,
and wins most but not all games against a random player).

``--results FILE`` appends one JSON line per seed and evaluation (contender ``ma_ppo``,
``env_steps``, ``return_mean``) and one per seed for the reference (contender
``random``), each with the date, the machine and the load average around it: the
committed ``benchmarks/multi_agent_results.jsonl`` is what the docs draw their figure
from. One torch thread, in this process.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import append_row, provenance, stamp  # a script beside this one

ENV = "pettingzoo:classic.tictactoe_v3"


def _random_players_only(module_id: str, obs: Tensor) -> tuple[Tensor, Tensor]:
    raise AssertionError("the reference has random players only")


def random_reference(games: int, seed: int) -> float:
    """Wins minus losses per game of a random focal player against a random opponent."""
    from rlloop.envs.multi_agent import make_multi_agent_env
    from rlloop.runners.multi_agent import RANDOM, evaluate_multi_agent

    env = make_multi_agent_env(ENV, 32, seed=seed + 1000)
    try:
        stats = evaluate_multi_agent(
            env,
            _random_players_only,
            lambda agent: RANDOM,
            RANDOM,
            games,
            torch.Generator().manual_seed(seed),
        )
    finally:
        env.close()
    return float(stats["return_mean"])


def train_seed(seed: int, budget: int, eval_every: int, games: int) -> list[dict[str, Any]]:
    """One seed's curve: the score against a random player before training and every
    ``eval_every`` env steps up to ``budget``, with the training seconds spent so far."""
    from rlloop.config.loading import build_config
    from rlloop.runs.build import build_algorithm
    from rlloop.trainers.loop import Trainer

    config = build_config(
        "ma_ppo", ENV, flags={"seed": seed}, sets=["mlflow=false", "progress=false"]
    )
    algo = build_algorithm(config)
    trainer = Trainer(algo, eval_episodes=games)
    points, train_s, next_eval = [], 0.0, eval_every
    try:
        points.append((0, 0.0, trainer.eval()["eval/return_mean"]))
        while trainer.state["env/steps"] < budget:
            start = time.perf_counter()
            trainer.step()
            train_s += time.perf_counter() - start
            steps = trainer.state["env/steps"]
            if steps >= next_eval or steps >= budget:
                next_eval += eval_every
                points.append((steps, train_s, trainer.eval()["eval/return_mean"]))
    finally:
        algo.close()
    return [
        {"env_steps": s, "train_s": round(t, 2), "return_mean": round(float(r), 4)}
        for s, t, r in points
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--budget", type=int, default=100_000)
    parser.add_argument("--eval-every", type=int, default=10_000)
    parser.add_argument("--games", type=int, default=400)
    parser.add_argument(
        "--results", type=Path, help="append one JSON row per seed and evaluation to this file"
    )
    args = parser.parse_args(argv)
    if min(args.budget, args.eval_every, args.games) < 1:
        raise SystemExit("--budget, --eval-every and --games must be >= 1")
    torch.set_num_threads(1)
    provenance()  # the commit this run measures, read before it starts
    settings = {"env": ENV, "budget": args.budget, "games": args.games}
    finals, references = [], []
    for seed in args.seeds:
        load = os.getloadavg()[0]
        reference = random_reference(args.games, seed)
        references.append(reference)
        rows = [
            {
                "contender": "random",
                "seed": seed,
                "env_steps": 0,
                "return_mean": round(reference, 4),
                **settings,
                **stamp(load),
            }
        ]
        for point in train_seed(seed, args.budget, args.eval_every, args.games):
            print(
                f"seed {seed}: {point['env_steps']:>7,} steps  {point['train_s']:6.1f} s  "
                f"vs random {point['return_mean']:+.3f}",
                flush=True,
            )
            rows.append({"contender": "ma_ppo", "seed": seed, **point, **settings, **stamp(load)})
        finals.append(rows[-1]["return_mean"])
        print(f"seed {seed}: random reference {reference:+.3f}", flush=True)
        if args.results:
            for row in rows:
                append_row(args.results, row)
    print(
        f"\ntic-tac-toe, {args.games} games against a random player, seeds {args.seeds}: "
        f"ma_ppo after {args.budget:,} steps {statistics.fmean(finals):+.3f} "
        f"(per seed {', '.join(f'{f:+.3f}' for f in finals)}); random player "
        f"{statistics.fmean(references):+.3f}"
    )


if __name__ == "__main__":
    main()
