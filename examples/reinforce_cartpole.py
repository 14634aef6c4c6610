"""REINFORCE on CartPole-v1 through rlloop's task API (bring your own algorithm).

The task says how to act (``get_actions``), what to learn from (``postprocess_trajectory``
attaches discounted returns; ``postprocess_trajectories`` normalises them over the epoch,
a constant baseline), and the loss (``run_model`` + ``compute_loss``). rlloop's
``TaskTrainer`` collects each epoch from env workers with batched inference, builds the
dataset and minibatches, checkpoints, and handles signals: ``SIGUSR1`` saves a checkpoint,
``SIGTERM``/``SIGINT`` save and exit; ``--resume`` continues.

Training stops once the greedy policy averages ``--solve-at`` (475, CartPole-v1's
threshold) over ``--eval-episodes`` (100) evaluation episodes, or when the train-step
budget is spent; the result reports that evaluation. ``--video`` trains nothing: it films
the policy of the run's newest checkpoint to ``<run-dir>/video.mp4``.

    python examples/reinforce_cartpole.py --run-dir runs/reinforce --workers 4 --mode process
    python examples/reinforce_cartpole.py --run-dir runs/reinforce --video
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

from rlloop.checkpoint import CheckpointManager
from rlloop.tasks import Sample, Task, TaskConfig, TaskTrainer
from rlloop.tasks.trainer import COMPONENTS


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
    """Settings that solved CartPole-v1 on every seed tried (see ``--total-steps``)."""
    settings: dict[str, Any] = {
        "num_env_workers": 8, "env_worker_mode": "sync", "num_epoch_samples": 4096,
        "batch_size": 1024, "lr": 1e-3, "total_steps": 400, "max_grad_norm": 1.0,
    }
    settings.update(overrides)
    return TaskConfig(**settings)


class GreedyReturnReaches:
    """Stop condition: the greedy policy's mean return over ``episodes`` evaluation
    episodes (Gym's definition of solved: 100) reaches ``threshold``.

    Evaluating is slow next to an epoch, so it is staged: only once the sampled policy's
    training return is half-way there, then on the first 20 episodes, then on all of them.
    """

    def __init__(self, task: ReinforceCartPole, model: nn.Module, threshold: float,
                 episodes: int = 100) -> None:
        self.task, self.model = task, model
        self.threshold, self.episodes = threshold, episodes
        self.reached = False

    def __call__(self, stats: Mapping[str, float]) -> bool:
        if stats.get("episode/return_mean", 0.0) < 0.5 * self.threshold:
            return False
        self.reached = all(
            self.task.evaluate(self.model, episodes=n)["return_mean"] >= self.threshold
            for n in (min(20, self.episodes), self.episodes))  # all() stops at the first miss
        return self.reached


def load_policy(run_dir: Path, seed: int) -> tuple[nn.Module, int]:
    """The policy of ``run_dir``'s newest checkpoint, and the train step it was saved at."""
    checkpoint = CheckpointManager(run_dir / "checkpoints").load_latest(
        expected_components=COMPONENTS)
    if checkpoint is None:
        raise SystemExit(f"{run_dir} has no checkpoint to film; train it first: "
                         f"python examples/reinforce_cartpole.py --run-dir {run_dir}")
    model = make_policy(seed)
    model.load_state_dict(checkpoint.components["model"])
    return model, int(checkpoint.components["trainer"]["counters"]["train/steps"])


def film(args: argparse.Namespace) -> dict[str, Any]:
    """One greedy episode of the trained policy to ``<run-dir>/video.mp4``; no training."""
    run_dir = Path(args.run_dir)
    model, steps = load_policy(run_dir, args.seed)
    task = ReinforceCartPole(default_config(seed=args.seed, env_seed=args.seed))
    path = run_dir / "video.mp4"
    states = task.sample_clip(model, save_path=path, return_states=True)
    return {"video": str(path), "frames": len(states),
            "episode_return": sum(s.reward for s in states), "train_steps": steps}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run-dir", help="checkpoints and metrics.jsonl go here")
    p.add_argument("--resume", action="store_true", help="continue from --run-dir")
    p.add_argument("--total-steps", type=int, default=400, help="train-step budget")
    p.add_argument("--epoch-samples", type=int, default=4096, help="env steps per epoch")
    p.add_argument("--workers", type=int, default=8, help="env workers (0: in-process)")
    p.add_argument("--mode", choices=("sync", "thread", "process"), default="sync")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--solve-at", type=float, default=475.0,
                   help="stop once the greedy policy's mean return reaches this")
    p.add_argument("--eval-episodes", type=int, default=100)
    p.add_argument("--video", action="store_true", help="film the policy of --run-dir's "
                   "newest checkpoint to <run-dir>/video.mp4 instead of training")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)
    if args.video:
        if not args.run_dir:
            p.error("--video needs --run-dir, the run whose policy to film")
        result = film(args)
        print(json.dumps(result), flush=True)
        return result

    config = default_config(num_env_workers=args.workers, env_worker_mode=args.mode,
                            total_steps=args.total_steps, num_epoch_samples=args.epoch_samples,
                            seed=args.seed, env_seed=args.seed)
    task = ReinforceCartPole(config)
    model = make_policy(args.seed)
    solved = GreedyReturnReaches(task, model, args.solve_at, args.eval_episodes)

    def report(stats: Mapping[str, float]) -> None:
        if not args.quiet:
            print(f"step {stats['train/steps']:5.0f}  env steps {stats['env/steps']:8.0f}  "
                  f"return {stats.get('episode/return_mean', float('nan')):6.1f}  "
                  f"restarts {stats['workers/restarts']:.0f}", flush=True)

    trainer = TaskTrainer(task, model, run_dir=args.run_dir, resume=args.resume,
                          on_epoch=[report])
    trainer.run(stop_conditions=[solved])
    stopped_by = trainer.stop_requested or ("solved" if solved.reached else "budget")
    result: dict[str, Any] = {"train_steps": trainer.state["train/steps"],
                              "env_steps": trainer.state["env/steps"], "stopped_by": stopped_by}
    if not trainer.stop_requested:
        evaluation = task.evaluate(model, episodes=args.eval_episodes)
        result.update({"eval_return_mean": evaluation["return_mean"],
                       "eval_return_min": evaluation["return_min"],
                       "eval_episodes": args.eval_episodes})
    print(json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    main()
