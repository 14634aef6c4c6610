"""REINFORCE on CartPole-v1 through rlloop's task API (bring your own algorithm).

The task says how to act (``get_actions``), what to learn from (``postprocess_trajectory``
attaches discounted returns; ``postprocess_trajectories`` normalises them over the epoch,
a constant baseline), and the loss (``run_model`` + ``compute_loss``). rlloop's
``TaskTrainer`` collects each epoch from env workers with batched inference, builds the
dataset and minibatches, checkpoints, and handles signals: ``SIGUSR1`` saves a checkpoint,
``SIGTERM``/``SIGINT`` save and exit; ``--resume`` continues.

    python examples/reinforce_cartpole.py --run-dir runs/reinforce --workers 4 --mode process
    python examples/reinforce_cartpole.py --run-dir runs/reinforce --resume --video clip.mp4
"""

from __future__ import annotations

import argparse
import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np
import torch
from torch import Tensor, nn

from rlloop.conditions import HitsUpperBound
from rlloop.tasks import Sample, Task, TaskConfig, TaskTrainer


@dataclass(frozen=True)
class ReturnSample:
    """What REINFORCE learns from; a minibatch holds these fields stacked to ``[B, ...]``."""

    obs: np.ndarray
    action: np.int64
    ret: np.float32


def discounted_returns(rewards: list[float], gamma: float) -> np.ndarray:
    """``G_t = r_t + gamma * G_{t+1}``, with ``G = 0`` after the last step."""
    out = np.zeros(len(rewards), dtype=np.float32)
    running = 0.0
    for t in reversed(range(len(rewards))):
        running = rewards[t] + gamma * running
        out[t] = running
    return out


class ReinforceCartPole(Task[nn.Module]):
    """Williams (1992) REINFORCE with reward-to-go and per-epoch normalised returns."""

    def __init__(self, config: TaskConfig, gamma: float = 0.99, ent_coef: float = 0.0) -> None:
        super().__init__(config)
        self.gamma, self.ent_coef = gamma, ent_coef

    def get_environment(self) -> gymnasium.Env[Any, Any]:
        return gymnasium.make("CartPole-v1", render_mode="rgb_array")

    def environment_factory(self) -> Any:
        # Torch-free and picklable: process workers start without importing this module.
        return functools.partial(gymnasium.make, "CartPole-v1", render_mode="rgb_array")

    def get_actions(self, model: nn.Module, states: Tensor, optimal: bool) -> Tensor:
        logits = model(states.float())
        if optimal:
            return logits.argmax(-1)
        return torch.distributions.Categorical(logits=logits).sample()

    def postprocess_trajectory(self, trajectory: list[Sample]) -> list[Any]:
        returns = discounted_returns([s.reward for s in trajectory], self.gamma)
        return [ReturnSample(s.obs, np.int64(s.action), g)
                for s, g in zip(trajectory, returns, strict=True)]

    def postprocess_trajectories(self, trajectories: list[list[Any]]) -> list[list[Any]]:
        returns = np.array([s.ret for t in trajectories for s in t], dtype=np.float32)
        if returns.size < 2:
            return trajectories
        mean, std = returns.mean(), returns.std() + 1e-8
        return [[ReturnSample(s.obs, s.action, np.float32((s.ret - mean) / std)) for s in t]
                for t in trajectories]

    def run_model(self, model: nn.Module, batch: ReturnSample) -> Tensor:
        return torch.log_softmax(model(torch.as_tensor(batch.obs).float()), -1)

    def compute_loss(self, model: nn.Module, batch: ReturnSample,
                     output: Tensor) -> Mapping[str, Tensor]:
        log_prob = output.gather(-1, torch.as_tensor(batch.action).long()[:, None]).squeeze(-1)
        entropy = -(output.exp() * output).sum(-1).mean()
        return {"policy": -(log_prob * torch.as_tensor(batch.ret)).mean(),
                "entropy": -self.ent_coef * entropy}


def make_policy(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(),
                         nn.Linear(64, 2))


def default_config(**overrides: Any) -> TaskConfig:
    """Settings that solved CartPole-v1 in about 200k env steps on seeds 0, 1 and 2."""
    settings: dict[str, Any] = {
        "num_env_workers": 8, "env_worker_mode": "sync", "num_epoch_samples": 4096,
        "batch_size": 1024, "lr": 1e-3, "total_steps": 300, "max_grad_norm": 1.0,
    }
    settings.update(overrides)
    return TaskConfig(**settings)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run-dir", help="checkpoints and metrics.jsonl go here")
    p.add_argument("--resume", action="store_true", help="continue from --run-dir")
    p.add_argument("--total-steps", type=int, default=300, help="train-step budget")
    p.add_argument("--epoch-samples", type=int, default=4096, help="env steps per epoch")
    p.add_argument("--workers", type=int, default=8, help="env workers (0: in-process)")
    p.add_argument("--mode", choices=("sync", "thread", "process"), default="sync")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--solve-at", type=float, default=490.0,
                   help="stop once the mean training return reaches this")
    p.add_argument("--eval-episodes", type=int, default=20)
    p.add_argument("--video", help="write a clip of the final policy to this mp4")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)

    config = default_config(num_env_workers=args.workers, env_worker_mode=args.mode,
                            total_steps=args.total_steps, num_epoch_samples=args.epoch_samples,
                            seed=args.seed, env_seed=args.seed)
    task = ReinforceCartPole(config)
    model = make_policy(args.seed)

    def report(stats: Mapping[str, float]) -> None:
        if not args.quiet:
            print(f"step {stats['train/steps']:5.0f}  env steps {stats['env/steps']:8.0f}  "
                  f"return {stats.get('episode/return_mean', float('nan')):6.1f}  "
                  f"restarts {stats['workers/restarts']:.0f}", flush=True)

    trainer = TaskTrainer(task, model, run_dir=args.run_dir, resume=args.resume,
                          on_epoch=[report])
    trainer.run(stop_conditions=[HitsUpperBound("episode/return_mean", args.solve_at)])
    result: dict[str, Any] = {"train_steps": trainer.state["train/steps"],
                              "env_steps": trainer.state["env/steps"],
                              "stopped_by": trainer.stop_requested or "done"}
    if not trainer.stop_requested:
        evaluation = task.evaluate(model, episodes=args.eval_episodes)
        result.update({"eval_return_mean": evaluation["return_mean"],
                       "eval_return_min": evaluation["return_min"]})
        if args.video:
            task.sample_clip(model, save_path=Path(args.video))
            result["video"] = args.video
    print(json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    main()
