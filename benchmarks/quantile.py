"""sb3-contrib's algorithms' training throughput (QR-DQN, TQC, CrossQ): rlloop vs
sb3-contrib, in one process.

Run: ``python benchmarks/quantile.py [--tasks qrdqn tqc crossq] [--qrdqn-steps N]
[--tqc-steps N] [--crossq-steps N] [--chunk N] [--threads N] [--seed S]``

Both tasks take rl-zoo's hyperparameters (rlloop's presets hold the same values), one env,
and step Gymnasium's env in both libraries (rlloop with ``backend=gymnasium``), so the
ratio is the training machinery's, not the env's:

- QR-DQN on CartPole-v1 (``hyperparams/qrdqn.yml``): lr 2.3e-3, batch 64, buffer 100k,
  1000 warm-up steps, train_freq 256 with 128 gradient steps, target synced once per
  rollout, epsilon 1 -> 0.04 over 16% of the budget, [256, 256] ReLU network with 10
  quantiles per action.
- TQC on Pendulum-v1 (``hyperparams/tqc.yml``): sb3-contrib's defaults with lr 1e-3:
  batch 256, 100 warm-up steps, one gradient step per env step, 2 critics of 25 quantiles
  (the top 2 of each dropped), [256, 256] networks, entropy tuned.
- CrossQ on Pendulum-v1 (``hyperparams/crossq.yml``): sb3-contrib's defaults (lr 1e-3,
  Adam betas (0.5, 0.999), batch 256, batch renormalisation with momentum 0.01) with
  policy_delay 2 and [256, 256] networks for the actor and the critics.

The two libraries alternate every ``--chunk`` env steps inside one process, so both see
the same machine load; each one's clock runs only during its own training. Printed: env
steps per second of each, their ratio (rlloop / sb3-contrib), and the mean return of each
trained policy on 10 deterministic episodes (a sanity check, not a comparison: one seed's
return at these budgets is mostly luck).
"""

from __future__ import annotations

import argparse
import time
from typing import Any, cast

import gymnasium as gym
import numpy as np
import torch

EVAL_SEED = 10_000
ENVS = {"qrdqn": "CartPole-v1", "tqc": "Pendulum-v1", "crossq": "Pendulum-v1"}


def evaluate(env_id: str, act: Any, episodes: int = 10) -> float:
    """Mean return of ``act(obs) -> action`` on ``episodes`` deterministic episodes."""
    env, returns = gym.make(env_id), []
    for i in range(episodes):
        obs, _ = env.reset(seed=EVAL_SEED + i)
        total, done = 0.0, False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(act(obs))
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    env.close()
    return float(np.mean(returns))


class Rlloop:
    """rlloop's trainer on the preset, advanced in chunks."""

    def __init__(self, algo: str, steps: int, seed: int) -> None:
        from rlloop.config.loading import build_config
        from rlloop.runs.build import build_algorithm
        from rlloop.trainers.loop import Trainer
        from rlloop.trainers.offpolicy_schedule import OffPolicyAlgorithm, OffPolicySchedule

        never = 10**12
        sets = ["mlflow=false", "progress=false", "num_envs=1", "backend=gymnasium",
                f"{algo}.eval_interval={never}", f"{algo}.record_interval={never}",
                f"{algo}.save_interval=0"]
        if algo == "qrdqn":  # sb3-contrib's exploration_fraction is relative to the budget
            sets.append(f"qrdqn.exploration_steps={int(0.16 * steps)}")
        config = build_config(algo, ENVS[algo], flags={"seed": seed, "total_env_steps": steps},
                              sets=sets)
        self.algo = algo
        self.algorithm: Any = build_algorithm(config)
        self.trainer = Trainer(self.algorithm, schedule=OffPolicySchedule(
            cast(OffPolicyAlgorithm, self.algorithm)))
        self.seconds = 0.0

    def advance(self, env_steps: int) -> None:
        start = time.perf_counter()
        while self.trainer.state["env/steps"] < env_steps:
            self.trainer.step()
        self.seconds += time.perf_counter() - start

    def act(self, obs: np.ndarray) -> Any:
        action = self.algorithm.act(torch.as_tensor(obs, dtype=torch.float32)[None])[0]
        return int(action) if self.algo == "qrdqn" else action.numpy()


def sb3_contrib_model(algo: str, seed: int) -> Any:
    from sb3_contrib import QRDQN, TQC, CrossQ

    env = gym.make(ENVS[algo])
    if algo == "qrdqn":
        return QRDQN("MlpPolicy", env, learning_rate=2.3e-3, batch_size=64,
                     buffer_size=100_000, learning_starts=1000, gamma=0.99,
                     target_update_interval=10, train_freq=256, gradient_steps=128,
                     exploration_fraction=0.16, exploration_final_eps=0.04,
                     policy_kwargs={"net_arch": [256, 256], "n_quantiles": 10}, seed=seed,
                     device="cpu")
    if algo == "crossq":
        return CrossQ("MlpPolicy", env, policy_delay=2, policy_kwargs={"net_arch": [256, 256]},
                      seed=seed, device="cpu")
    return TQC("MlpPolicy", env, learning_rate=1e-3, seed=seed, device="cpu")


def run(algo: str, steps: int, chunk: int, seed: int) -> float:
    """Train both for ``steps`` env steps, alternating; print and return the ratio."""
    from stable_baselines3.common.callbacks import BaseCallback

    ours = Rlloop(algo, steps, seed)
    model = sb3_contrib_model(algo, seed)

    class Alternate(BaseCallback):
        def _on_step(self) -> bool:
            if self.num_timesteps % chunk == 0:
                ours.advance(self.num_timesteps)
            return True

    start = time.perf_counter()
    model.learn(total_timesteps=steps, callback=Alternate())
    theirs = time.perf_counter() - start - ours.seconds
    ours.advance(steps)
    sps_ours, sps_theirs = steps / ours.seconds, steps / theirs

    def peer_act(obs: np.ndarray) -> Any:
        action = model.predict(obs, deterministic=True)[0]
        return int(action) if algo == "qrdqn" else action

    returns = evaluate(ENVS[algo], ours.act), evaluate(ENVS[algo], peer_act)
    ours.algorithm.close()
    print(f"{algo} {ENVS[algo]}, {steps} env steps, {torch.get_num_threads()} thread(s)")
    print(f"  rlloop       {sps_ours:8.1f} env steps/s  return {returns[0]:8.1f}")
    print(f"  sb3-contrib  {sps_theirs:8.1f} env steps/s  return {returns[1]:8.1f}")
    print(f"{algo} {ENVS[algo]}: rlloop / sb3-contrib env steps/s {sps_ours / sps_theirs:.2f}x")
    return sps_ours / sps_theirs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", choices=sorted(ENVS), default=sorted(ENVS))
    parser.add_argument("--qrdqn-steps", type=int, default=20_000)
    parser.add_argument("--tqc-steps", type=int, default=2_000)
    parser.add_argument("--crossq-steps", type=int, default=2_000)
    parser.add_argument("--chunk", type=int, default=0,
                        help="env steps between switches (0: a tenth of the budget)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    for algo in args.tasks:
        steps = {"qrdqn": args.qrdqn_steps, "tqc": args.tqc_steps,
                 "crossq": args.crossq_steps}[algo]
        run(algo, steps, args.chunk or max(1, steps // 10), args.seed)


if __name__ == "__main__":
    main()
