"""Quantile algorithms' training throughput: rlloop vs sb3-contrib, in one process.

Run: ``python benchmarks/quantile.py [--steps N] [--chunk N] [--threads N] [--seed S]``

QR-DQN on CartPole-v1 with rl-zoo's ``hyperparams/qrdqn.yml`` values (rlloop's CartPole
preset holds the same): lr 2.3e-3, batch 64, buffer 100k, 1000 warm-up steps, train_freq
256 with 128 gradient steps, target synced once per rollout, epsilon 1 -> 0.04 over 16%
of the budget, [256, 256] ReLU network with 10 quantiles per action, one env. Both
libraries step Gymnasium's CartPole (rlloop with ``backend=gymnasium``), so the ratio is
the training machinery's, not the env's.

The two runs alternate every ``--chunk`` env steps inside one process, so both see the
same machine load; each one's clock runs only during its own training. Printed: env
steps per second of each, their ratio (rlloop / sb3-contrib), and the mean return of
each trained policy on 10 deterministic episodes (a sanity check, not a comparison:
one seed's return at this budget is mostly luck).
"""

from __future__ import annotations

import argparse
import time
from typing import Any, cast

import gymnasium as gym
import numpy as np
import torch

EVAL_SEED = 10_000


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

    def __init__(self, steps: int, seed: int) -> None:
        from rlloop.config.loading import build_config
        from rlloop.runs.build import build_algorithm
        from rlloop.trainers.loop import Trainer
        from rlloop.trainers.offpolicy_schedule import OffPolicyAlgorithm, OffPolicySchedule

        never = 10**12
        config = build_config("qrdqn", "CartPole-v1", flags={
            "seed": seed, "total_env_steps": steps}, sets=[
                "mlflow=false", "progress=false", "num_envs=1", "backend=gymnasium",
                f"qrdqn.eval_interval={never}", f"qrdqn.record_interval={never}",
                "qrdqn.save_interval=0", f"qrdqn.exploration_steps={int(0.16 * steps)}"])
        self.algorithm: Any = build_algorithm(config)
        self.trainer = Trainer(self.algorithm, schedule=OffPolicySchedule(
            cast(OffPolicyAlgorithm, self.algorithm)))
        self.seconds = 0.0

    def advance(self, env_steps: int) -> None:
        start = time.perf_counter()
        while self.trainer.state["env/steps"] < env_steps:
            self.trainer.step()
        self.seconds += time.perf_counter() - start

    def act(self, obs: np.ndarray) -> int:
        return int(self.algorithm.act(torch.as_tensor(obs, dtype=torch.float32)[None])[0])


def sb3_contrib_model(seed: int) -> Any:
    from sb3_contrib import QRDQN

    return QRDQN("MlpPolicy", gym.make("CartPole-v1"), learning_rate=2.3e-3, batch_size=64,
                 buffer_size=100_000, learning_starts=1000, gamma=0.99,
                 target_update_interval=10, train_freq=256, gradient_steps=128,
                 exploration_fraction=0.16, exploration_final_eps=0.04,
                 policy_kwargs={"net_arch": [256, 256], "n_quantiles": 10}, seed=seed,
                 device="cpu")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20_000, help="env steps per library")
    parser.add_argument("--chunk", type=int, default=2048, help="env steps between switches")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    from stable_baselines3.common.callbacks import BaseCallback

    ours = Rlloop(args.steps, args.seed)
    model = sb3_contrib_model(args.seed)

    class Alternate(BaseCallback):
        def _on_step(self) -> bool:
            if self.num_timesteps % args.chunk == 0:
                ours.advance(self.num_timesteps)
            return True

    start = time.perf_counter()
    model.learn(total_timesteps=args.steps, callback=Alternate())
    theirs = time.perf_counter() - start - ours.seconds
    ours.advance(args.steps)
    sps_ours, sps_theirs = args.steps / ours.seconds, args.steps / theirs
    returns = (evaluate("CartPole-v1", ours.act),
               evaluate("CartPole-v1", lambda o: int(model.predict(o, deterministic=True)[0])))
    print(f"qrdqn CartPole-v1, {args.steps} env steps, {args.threads} thread(s)")
    print(f"  rlloop       {sps_ours:8.1f} env steps/s  return {returns[0]:6.1f}")
    print(f"  sb3-contrib  {sps_theirs:8.1f} env steps/s  return {returns[1]:6.1f}")
    print(f"qrdqn CartPole-v1: rlloop / sb3-contrib env steps/s {sps_ours / sps_theirs:.2f}x")
    ours.algorithm.close()


if __name__ == "__main__":
    main()
