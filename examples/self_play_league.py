"""Self-play with a league on tic-tac-toe (PettingZoo), through the rlloop CLI.

The main module plays frozen snapshots of itself: every ``--every`` iterations a copy of
it joins the league as a new opponent module (``main_v1``, ``main_v2``, ...); the oldest
leaves beyond ``--size``. Only ``main`` is trained. This script is the command

    rlloop train ma_ppo --env pettingzoo:classic.tictactoe_v3 \\
        --set ma_ppo.league_every=5 --set ma_ppo.league_size=4 --total-env-steps 100000

followed by a look at the league in the final checkpoint and at ``league/size`` in the
run's metrics:

    python examples/self_play_league.py --run-dir runs/league --every 5 --size 4
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rlloop.checkpoint import CheckpointManager, load_checkpoint
from rlloop.cli.main import main as rlloop


def run(run_dir: Path, env: str, every: int, size: int, steps: int, seed: int) -> dict:
    """Train with the CLI; returns the league (snapshot ids) of the final checkpoint."""
    code = rlloop(["train", "ma_ppo", "--env", env, "--run-dir", str(run_dir),
                   "--total-env-steps", str(steps), "--seed", str(seed), "--quiet",
                   "--set", f"ma_ppo.league_every={every}", "--set", f"ma_ppo.league_size={size}",
                   "--set", "eval_every=10", "--set", "mlflow=false"])
    if code:
        raise SystemExit(code)
    latest = CheckpointManager(run_dir / "checkpoints").latest()
    assert latest is not None
    return dict(load_checkpoint(latest).components["algorithm"]["league"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run-dir", type=Path, default=Path("runs/self-play-league"))
    p.add_argument("--env", default="pettingzoo:classic.tictactoe_v3")
    p.add_argument("--every", type=int, default=5, help="iterations between snapshots")
    p.add_argument("--size", type=int, default=4, help="most snapshots kept")
    p.add_argument("--steps", type=int, default=100_000, help="env step budget")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    league = run(args.run_dir, args.env, args.every, args.size, args.steps, args.seed)
    sizes = [row["league/size"] for row in map(json.loads, (args.run_dir / "metrics.jsonl")
                                                 .read_text().splitlines())
             if "league/size" in row]
    print(f"league after {len(sizes)} iterations: {league['snapshots']} "
          f"({league['created']} snapshots taken, sizes over time {sorted(set(sizes))})")


if __name__ == "__main__":
    main()
