"""Whole-process wall time of rlloop's main command and of ``rlloop eval``, against SB3.

Run: ``python benchmarks/cli_wall.py [--runs 5] [--quick]``

What a user waits for, from enter to prompt, each command as its own process:

- ``python -c "import torch"``: the floor every torch program pays;
- ``rlloop train ppo --env CartPole-v1``: the README's main command, every default on
  (MLflow store, report, video, console, checkpoints), until solved;
- an equivalent Stable-Baselines3 script: rl-zoo's PPO hyperparameters for CartPole-v1,
  ``EvalCallback`` on rlloop's schedule (every 2,560 env steps, 32 deterministic episodes,
  stopping at 475), then ``model.save``;
- ``rlloop eval RUN`` (20 episodes) and the SB3 counterpart (``PPO.load`` +
  ``evaluate_policy`` over 20 episodes).

The commands are run interleaved (one of each per round) and the median of the rounds is
reported with the load average, since other work on the machine moves every figure.
``--quick`` (for the test that keeps this script working) trains 512 steps, one round.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SB3_TRAIN = """
import sys
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import EvalCallback, StopTrainingOnRewardThreshold
from stable_baselines3.common.env_util import make_vec_env

budget, path = int(sys.argv[1]), sys.argv[2]


def linear(start):
    return lambda progress_remaining: progress_remaining * start


env = make_vec_env("CartPole-v1", n_envs=8, seed=0)
eval_env = make_vec_env("CartPole-v1", n_envs=1, seed=1000)
# rl-zoo's hyperparams/ppo.yml for CartPole-v1
model = PPO("MlpPolicy", env, n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98,
            n_epochs=20, ent_coef=0.0, learning_rate=linear(1e-3), clip_range=linear(0.2),
            seed=0, device="cpu", verbose=0)
# rlloop's schedule: every 2,560 env steps (EvalCallback counts steps of the 8 envs), 32
# deterministic episodes, stop at CartPole-v1's threshold.
stop = StopTrainingOnRewardThreshold(reward_threshold=475, verbose=0)
evaluate = EvalCallback(eval_env, eval_freq=2560 // 8, n_eval_episodes=32, deterministic=True,
                        callback_on_new_best=stop, verbose=0)
model.learn(total_timesteps=budget, callback=evaluate)
model.save(path)
"""

SB3_EVAL = """
import sys
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy

model = PPO.load(sys.argv[1], device="cpu")
mean, std = evaluate_policy(model, make_vec_env("CartPole-v1", n_envs=1, seed=2000),
                            n_eval_episodes=20, deterministic=True)
print(f"{mean:.1f} +- {std:.1f}")
"""


def timed(command: list[str], cwd: Path) -> float:
    t0 = time.perf_counter()
    out = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    elapsed = time.perf_counter() - t0
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({out.returncode}):\n{out.stderr[-2000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="interleaved rounds (median)")
    parser.add_argument("--quick", action="store_true", help="512 training steps, 1 round")
    parser.add_argument("--workdir", help="where runs are written (default: a temp folder)")
    args = parser.parse_args()
    runs = 1 if args.quick else args.runs
    budget = 512 if args.quick else 200_000
    work = Path(args.workdir or tempfile.mkdtemp(prefix="cli-wall-"))
    (work / "sb3_train.py").write_text(SB3_TRAIN)
    (work / "sb3_eval.py").write_text(SB3_EVAL)
    py = sys.executable
    limit = ["--total-env-steps", str(budget)] if args.quick else []
    load_before = os.getloadavg()

    times: dict[str, list[float]] = {}
    for i in range(runs):
        run_dir = work / f"rlloop-{i}"
        model = work / f"sb3-{i}.zip"
        commands = {
            'python -c "import torch"': [py, "-c", "import torch"],
            "rlloop train ppo --env CartPole-v1": [py, "-m", "rlloop", "train", "ppo", "--env",
                                                   "CartPole-v1", "--run-dir", str(run_dir),
                                                   *limit],
            "SB3 PPO script (rl-zoo, EvalCallback, save)": [py, "sb3_train.py", str(budget),
                                                            str(model)],
            "rlloop eval RUN": [py, "-m", "rlloop", "eval", str(run_dir)],
            "SB3 load + evaluate_policy": [py, "sb3_eval.py", str(model)],
        }
        for name, command in commands.items():
            times.setdefault(name, []).append(timed(command, work))

    median = {name: statistics.median(values) for name, values in times.items()}
    floor = median['python -c "import torch"']
    print(f"whole-process wall time, median of {runs} interleaved round(s); load average "
          f"{load_before[0]:.2f} before, {os.getloadavg()[0]:.2f} after, "
          f"{os.cpu_count()} CPUs")
    print(f"{'command':46s} {'median s':>9s} {'over floor':>11s}  rounds")
    for name, value in median.items():
        rounds = " ".join(f"{v:.2f}" for v in times[name])
        print(f"{name:46s} {value:9.2f} {value - floor:+11.2f}  {rounds}")
    train = median["rlloop train ppo --env CartPole-v1"]
    sb3 = median["SB3 PPO script (rl-zoo, EvalCallback, save)"]
    evaluate = median["rlloop eval RUN"]
    sb3_eval = median["SB3 load + evaluate_policy"]
    print(f"train: SB3 / rlloop = {sb3 / train:.2f}x; eval: SB3 / rlloop = "
          f"{sb3_eval / evaluate:.2f}x")


if __name__ == "__main__":
    main()
