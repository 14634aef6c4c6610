"""Multi-agent PPO on PettingZoo's tic-tac-toe, scored against a random player.

Each seat gets its own module (independent learners; ``--shared`` uses one module for both
seats instead). Training is the CLI's: the same as

    rlloop train ma_ppo --env pettingzoo:classic.tictactoe_v3 \\
        --set ma_ppo.policy_mapping=independent --total-env-steps 100000

and the result is compared with a random player in the same seats (return = wins - losses
per game, each seat half of the games):

    python examples/multi_agent_tictactoe.py --run-dir runs/ttt --steps 100000
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from torch import Tensor

from rlloop.checkpoint import load_checkpoint
from rlloop.cli.main import main as rlloop
from rlloop.envs.multi_agent import make_multi_agent_env
from rlloop.runners.multi_agent import RANDOM, evaluate_multi_agent
from rlloop.runs.build import COMPONENTS, build_algorithm
from rlloop.runs.saved import load_run_config, policy_checkpoint

ENV = "pettingzoo:classic.tictactoe_v3"


def no_module(module_id: str, obs: Tensor) -> tuple[Tensor, Tensor]:
    raise AssertionError("the baseline has random players only")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run-dir", type=Path, default=Path("runs/ma-tictactoe"))
    p.add_argument("--steps", type=int, default=100_000)
    p.add_argument("--shared", action="store_true", help="one module for both seats")
    p.add_argument("--episodes", type=int, default=400)
    args = p.parse_args()
    mapping = "shared" if args.shared else "independent"
    code = rlloop(["train", "ma_ppo", "--env", ENV,
                   "--run-dir", str(args.run_dir), "--total-env-steps", str(args.steps),
                   "--quiet", "--set", f"ma_ppo.policy_mapping={mapping}",
                   "--set", "mlflow=false"])
    if code:
        raise SystemExit(code)
    algo = build_algorithm(load_run_config(args.run_dir, mlflow=False))
    state = load_checkpoint(policy_checkpoint(args.run_dir), expected_components=COMPONENTS)
    algo.set_policy_state(state.components["algorithm"])
    trained = algo.evaluate(args.episodes)
    env = make_multi_agent_env(ENV, 32, seed=1)
    rand = evaluate_multi_agent(env, no_module, lambda a: RANDOM, RANDOM, args.episodes,
                                torch.Generator().manual_seed(0))
    env.close()
    for key in sorted(k for k in trained if k.endswith("return_mean")):
        print(f"{key:28s} trained {trained[key]:+.3f}")
    print(f"random player in the same seats: {rand['return_mean']:+.3f}")
    algo.close()


if __name__ == "__main__":
    main()
