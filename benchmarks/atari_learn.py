"""A short Atari learning run: rlloop's PPO preset for a fixed budget, its policy
against the same network untrained.

Run: ``python benchmarks/atari_learn.py [--env ALE/Breakout-v5] [--steps 200000]
[--seeds 0] [--episodes 20] [--set KEY=VALUE ...] [--runs-dir DIR]``

``benchmarks/pixels.py`` times Atari training; this shows that the same preset learns.
PPO trains on the env's preset (rl-zoo's Atari hyperparameters: 8 envs x 128 steps, the
Nature CNN, the Atari preprocessing with episodic life) for ``--steps`` env steps, far
short of rl-zoo's 10M, evaluating every 25 iterations. Then the run's best policy and the
untrained network of the same seed are each played for ``--episodes`` episodes on the
evaluation env. Returns are the game's score per life, as the learner sees its episodes
(a lost life ends one). The untrained network's near-uniform action distribution, sampled,
is the random baseline; the trained policy is reported sampled (as PPO acts while
training) and greedy.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from zoo import QUIET  # a sibling script: no MLflow, progress or video; no solve stop

from rlloop.algorithms.base import AlgorithmBase
from rlloop.config.loading import build_config
from rlloop.runs.saved import load_policy, load_run_policy
from rlloop.runs.start import train


def score(algorithm: AlgorithmBase, episodes: int, deterministic: bool) -> str:
    """``mean ± std`` of ``episodes`` per-life returns of ``algorithm``'s policy."""
    out = algorithm.evaluate(episodes, deterministic=deterministic)
    return f"{out['return_mean']:.2f} ± {out['return_std']:.2f}"


def learn(env_id: str, steps: int, seed: int, episodes: int, sets: list[str],
          runs: Path) -> str:
    """One seed's report line: the untrained and the trained policy's returns."""
    config = build_config("ppo", env_id, flags={"seed": seed, "total_env_steps": steps},
                          sets=[*QUIET, "eval_every=25", *sets])
    untrained = load_policy(config, None)
    try:
        before = score(untrained, episodes, deterministic=False)
    finally:
        untrained.close()
    start = time.perf_counter()
    result = train(config, runs / f"{env_id.replace('/', '-')}-ppo-{seed}")
    seconds = time.perf_counter() - start
    trained = load_run_policy(result.run_dir)
    try:
        sampled = score(trained, episodes, deterministic=False)
        greedy = score(trained, episodes, deterministic=True)
    finally:
        trained.close()
    return (f"{env_id} ppo seed {seed}: {result.env_steps:,} env steps in {seconds:.0f} s; "
            f"per-life return over {episodes} episodes: untrained (sampled) {before}, "
            f"trained (sampled) {sampled}, trained (greedy) {greedy}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--env", default="ALE/Breakout-v5")
    p.add_argument("--steps", type=int, default=200_000, help="env steps (default 200,000)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--episodes", type=int, default=20)
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="a setting on top of the preset, as rlloop train's --set")
    p.add_argument("--runs-dir", help="where the runs go (default: a temporary directory)")
    args = p.parse_args()
    if args.steps < 1 or args.episodes < 1:
        p.error("--steps and --episodes must be >= 1")
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="atari-learn-") as tmp:
        runs = Path(args.runs_dir or tmp)
        for seed in args.seeds:
            print(learn(args.env, args.steps, seed, args.episodes, args.sets, runs), flush=True)


if __name__ == "__main__":
    main()
