"""Recurrent PPO on masked-velocity CartPole: rlloop vs sb3-contrib's RecurrentPPO.

Run: ``python benchmarks/recurrent.py [--seeds 0 1 2] [--budget 200000]
[--results recurrent_results.jsonl]``

The task is CartPole-v1 with the velocities hidden (position and angle only), which a
feed-forward policy cannot solve: rlloop trains on its native env with
``env.mask_velocity=true``, sb3-contrib on the Gymnasium wrapper
``rlloop.envs.masked_velocity.MaskVelocity`` (the same observations).

For each contender and seed, training runs until a deterministic evaluation of
``--eval-episodes`` episodes, every ``--eval-every`` env steps, reaches 475. Reported
per contender (median over seeds): ``solve_s`` (training wall time to the solving
evaluation, evaluations excluded), ``solve_total_s`` (with them), ``solve_steps`` and
``train_sps`` (env steps per second of training).

sb3-contrib uses rl-zoo's ``ppo_lstm`` hyperparameters for CartPoleNoVel-v1 (LSTM 64,
separate critic LSTM, 8 envs x 32 steps, 20 epochs, VecNormalize); rlloop uses its
CartPole-v1 preset plus ``ppo.recurrent=gru`` (cell width 64, sequences of 16 steps).
Both run with one torch thread, in the same process, one after another.

``--results FILE`` appends one JSON line per contender and seed as it finishes (the
committed ``benchmarks/recurrent_results.jsonl`` is what the docs draw their figure from),
each with the date, the machine and the load average around it.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ppo_cartpole import (  # a script beside this one
    THRESHOLD,
    Outcome,
    median,
    print_medians,
    run_seeds,
    sb3_until_solved,
    solve_rlloop,
)
from results import append_row, provenance, stamp  # a script beside this one

RLLOOP_SETS = ["mlflow=false", "progress=false", "env.mask_velocity=true",
               "ppo.recurrent=gru"]


def run_rlloop(seed: int, budget: int, eval_every: int, episodes: int,
               extra: list[str]) -> Outcome:
    from rlloop.config.loading import build_config

    config = build_config("ppo", "CartPole-v1", flags={"seed": seed},
                          sets=[*RLLOOP_SETS, *extra])
    return solve_rlloop(config, budget, eval_every, episodes)


def run_sb3_contrib(seed: int, budget: int, eval_every: int, episodes: int) -> Outcome:
    import gymnasium
    import numpy as np
    from sb3_contrib import RecurrentPPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize
    from torch import nn

    from rlloop.envs.masked_velocity import ENV_ID

    def linear(start: float) -> Callable[[float], float]:
        return lambda progress_remaining: progress_remaining * start

    assert ENV_ID in gymnasium.registry  # registered by the import above
    env = VecNormalize(make_vec_env(ENV_ID, n_envs=8, seed=seed))
    eval_env = VecNormalize(make_vec_env(ENV_ID, n_envs=1, seed=seed + 1000),
                            training=False, norm_reward=False)
    # rl-zoo's hyperparams/ppo_lstm.yml for CartPoleNoVel-v1
    model = RecurrentPPO(
        "MlpLstmPolicy", env, n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98,
        n_epochs=20, ent_coef=0.0, learning_rate=linear(1e-3), clip_range=linear(0.2),
        policy_kwargs={"ortho_init": False, "activation_fn": nn.ReLU, "lstm_hidden_size": 64,
                       "enable_critic_lstm": True, "net_arch": {"pi": [64], "vf": [64]}},
        seed=seed, device="cpu", verbose=0)

    def evaluate() -> float:
        """Whole deterministic episodes, the LSTM state carried and reset per episode."""
        eval_env.obs_rms = env.obs_rms
        returns: list[float] = []
        for _ in range(episodes):
            obs = eval_env.reset()
            state, start, total, done = None, np.ones((1,), dtype=bool), 0.0, False
            while not done:
                action, state = model.predict(obs, state=state, episode_start=start,
                                              deterministic=True)
                obs, reward, dones, _ = eval_env.step(action)
                total += float(reward[0])
                done = bool(dones[0])
                start = dones
            returns.append(total)
        return float(np.mean(returns))

    return sb3_until_solved(model, evaluate, budget, eval_every, [env, eval_env])


def recorded(name: str, run: Callable[[int], Outcome], path: Path,
             settings: dict[str, int]) -> Callable[[int], Outcome]:
    """``run``, with each seed's outcome appended to ``path`` as one row."""
    def run_and_record(seed: int) -> Outcome:
        load = os.getloadavg()[0]
        out = run(seed)
        append_row(path, {"contender": name, "seed": seed, "solved": out.solved,
                          "solve_steps": out.solve_steps, "solve_s": round(out.solve_s, 2),
                          "solve_total_s": round(out.solve_total_s, 2),
                          "train_sps": round(out.train_sps, 1),
                          "final_return": out.final_eval, **settings, **stamp(load)})
        return out

    return run_and_record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--budget", type=int, default=200_000)
    parser.add_argument("--eval-every", type=int, default=2560)
    parser.add_argument("--eval-episodes", type=int, default=20)
    parser.add_argument("--only", choices=["rlloop", "sb3-contrib", "rlloop-ff"],
                        nargs="+", default=["rlloop", "sb3-contrib"],
                        help="contenders (rlloop-ff: feed-forward rlloop PPO, as a control)")
    parser.add_argument("--results", type=Path,
                        help="append one JSON row per contender and seed to this file")
    args = parser.parse_args()
    torch.set_num_threads(1)

    contenders: dict[str, Callable[[int], Outcome]] = {
        "rlloop": lambda s: run_rlloop(s, args.budget, args.eval_every, args.eval_episodes,
                                       []),
        "rlloop-ff": lambda s: run_rlloop(s, args.budget, args.eval_every, args.eval_episodes,
                                          ["ppo.recurrent=null"]),
        "sb3-contrib": lambda s: run_sb3_contrib(s, args.budget, args.eval_every,
                                                 args.eval_episodes),
    }
    chosen = {name: contenders[name] for name in args.only}
    if args.results:
        provenance()  # the commit this run measures, read before it starts
        settings = {"budget": args.budget, "eval_every": args.eval_every,
                    "eval_episodes": args.eval_episodes}
        chosen = {name: recorded(name, run, args.results, settings)
                  for name, run in chosen.items()}
    results = run_seeds(chosen, args.seeds, width=12, digits=1)
    print_medians(results, f"Recurrent PPO, masked-velocity CartPole, median over seeds "
                  f"{args.seeds} (threshold {THRESHOLD:.0f}, {args.eval_episodes} deterministic "
                  f"episodes every {args.eval_every} steps, budget {args.budget:,})",
                  width=12, digits=1)
    if "rlloop" in results and "sb3-contrib" in results:
        def ratio(field: str, num: str = "sb3-contrib", den: str = "rlloop") -> float:
            return median(results[num], field) / median(results[den], field)

        print(f"\nrlloop vs sb3-contrib: solve time {ratio('solve_s'):.1f}x sooner, with "
              f"evaluations {ratio('solve_total_s'):.1f}x, train steps/s "
              f"{ratio('train_sps', 'rlloop', 'sb3-contrib'):.1f}x")


if __name__ == "__main__":
    main()
