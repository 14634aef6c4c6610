"""Stable-Baselines3 with rl-zoo's hyperparameters on a zoo row, measured as ``zoo.py``
measures rlloop: how often SB3 itself reaches rl-zoo's published score.

Run: ``python benchmarks/zoo_sb3.py MountainCar-v0/dqn [--seeds 3] [--first-seed 0]
[--fraction F] [--eval-episodes N]``

rl-zoo publishes one run per row. Where rlloop's 3-seed mean falls short because a seed
fails, this says whether SB3 fails on some seeds too. The method is ``zoo.py``'s: train
rl-zoo's full budget, evaluate every ``eval_every`` env steps on ``eval_episodes``
deterministic episodes (the same cadence as rlloop's preset), keep the best policy, then
score it afresh on 20 deterministic episodes with seeds the training never saw.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from offpolicy import evaluate_gym  # a sibling script: 20 episodes on seeds 10,000 and up

#: rl-zoo's hyperparameters (SB3's units) and rlloop's preset evaluation cadence per row.
ROWS: dict[str, dict[str, Any]] = {
    "MountainCar-v0/dqn": {
        "budget": 120_000, "eval_every": 2_000, "eval_episodes": 20,
        "kwargs": {"learning_rate": 4e-3, "batch_size": 128, "buffer_size": 10_000,
                   "learning_starts": 1_000, "gamma": 0.98, "target_update_interval": 600,
                   "train_freq": 16, "gradient_steps": 8, "exploration_fraction": 0.2,
                   "exploration_final_eps": 0.07,
                   "policy_kwargs": {"net_arch": [256, 256]}},
    },
    # rl-zoo's Ant-v4 entry: SB3's PPO defaults with VecNormalize (observations and
    # rewards); rlloop's preset evaluates every 4 rollouts of 2,048 steps on 5 episodes.
    "Ant-v5/ppo": {
        "budget": 1_000_000, "eval_every": 8_192, "eval_episodes": 5, "normalize": True,
        "kwargs": {},
    },
    # rl-zoo's TQC FetchReach-v1 entry (tqc.yml, HerReplayBuffer with future goals, 4 per
    # real transition, normalize: true), as rlloop's preset.
    "FetchReach-v4/tqc": {
        "budget": 20_000, "eval_every": 2_000, "eval_episodes": 10, "her": True,
        "normalize": True,
        "kwargs": {"buffer_size": 1_000_000, "batch_size": 256, "gamma": 0.95,
                   "learning_rate": 1e-3, "learning_starts": 1_000,
                   "replay_buffer_kwargs": {"goal_selection_strategy": "future",
                                            "n_sampled_goal": 4},
                   "policy_kwargs": {"net_arch": [64, 64], "n_critics": 1}},
    },
    "LunarLanderContinuous-v3/ppo": {
        "budget": 1_000_000, "n_envs": 16, "eval_every": 16_384, "eval_episodes": 20,
        "kwargs": {"n_steps": 1024, "batch_size": 64, "gae_lambda": 0.98, "gamma": 0.999,
                   "n_epochs": 4, "ent_coef": 0.01},
    },
    # rl-zoo's LunarLander entry (lr lin_0.00083: falls linearly to 0 over the budget);
    # rlloop's preset evaluates every 250 iterations of 8 x 5 steps on 10 episodes.
    "LunarLander-v3/a2c": {
        "budget": 200_000, "n_envs": 8, "eval_every": 10_000, "eval_episodes": 10,
        "kwargs": {"n_steps": 5, "gamma": 0.995, "ent_coef": 1e-5,
                   "learning_rate": lambda progress_remaining: 0.00083 * progress_remaining},
    },
}


def train_seed(row: str, seed: int, fraction: float = 1.0, episodes: int | None = None,
               normalize: bool = False) -> tuple[float, float]:
    """(best evaluation while training, the best policy's fresh score) of one seed, on
    ``fraction`` of rl-zoo's budget; ``episodes`` per evaluation (default: the row's);
    ``normalize``: with VecNormalize even where the row has none."""
    import copy

    import gymnasium as gym
    import stable_baselines3
    from stable_baselines3.common.callbacks import BaseCallback, EvalCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    env_id, algo = row.split("/")
    spec = {**ROWS[row], **({"normalize": True} if normalize else {})}
    n_envs = spec.get("n_envs", 1)
    kwargs, policy = dict(spec["kwargs"]), "MlpPolicy"
    if spec.get("her"):  # a goal env: Gymnasium-Robotics' ids, Dict observations
        import gymnasium_robotics
        from stable_baselines3 import HerReplayBuffer

        gym.register_envs(gymnasium_robotics)
        kwargs["replay_buffer_class"], policy = HerReplayBuffer, "MultiInputPolicy"
    if hasattr(stable_baselines3, algo.upper()):
        cls = getattr(stable_baselines3, algo.upper())
    else:
        import sb3_contrib
        cls = getattr(sb3_contrib, algo.upper())
    env: Any = gym.make(env_id) if n_envs == 1 else make_vec_env(env_id, n_envs=n_envs,
                                                                 seed=seed)
    eval_env: Any = Monitor(gym.make(env_id))
    if spec.get("normalize"):  # rl-zoo's `normalize: true`, with the algorithm's discount
        env = VecNormalize(env if n_envs > 1 else DummyVecEnv([lambda: gym.make(env_id)]),
                           gamma=spec["kwargs"].get("gamma", 0.99))
        # EvalCallback copies the training statistics into it before each evaluation
        eval_env = VecNormalize(DummyVecEnv([lambda: Monitor(gym.make(env_id))]),
                                training=False, norm_reward=False)
    kept: dict[str, Any] = {}

    class KeepStatistics(BaseCallback):
        """At a new best evaluation, keep the observation statistics it was scored with."""

        def _on_step(self) -> bool:
            kept["obs_rms"] = copy.deepcopy(getattr(eval_env, "obs_rms", None))
            return True

    model = cls(policy, env, seed=seed, device="cpu", **kwargs)
    fresh_episodes = episodes or 20
    with tempfile.TemporaryDirectory(prefix="zoo-sb3-") as tmp:
        # EvalCallback counts vectorised steps: every eval_every env steps over all envs
        callback = EvalCallback(eval_env, n_eval_episodes=episodes or spec["eval_episodes"],
                                eval_freq=max(spec["eval_every"] // n_envs, 1),
                                best_model_save_path=tmp, callback_on_new_best=KeepStatistics(),
                                deterministic=True, verbose=0)
        model.learn(total_timesteps=round(fraction * spec["budget"]), callback=callback)
        # (a HerReplayBuffer is built again on load, and needs the env for it)
        best = cls.load(Path(tmp) / "best_model.zip", device="cpu",
                        env=env if spec.get("her") else None)
        if kept.get("obs_rms") is not None:
            eval_env.obs_rms = kept["obs_rms"]
            fresh = evaluate_gym(env_id, lambda obs: best.predict(
                eval_env.normalize_obs(obs), deterministic=True)[0], fresh_episodes)
        else:
            fresh = evaluate_gym(env_id, lambda obs: best.predict(obs, deterministic=True)[0],
                                 fresh_episodes)
        return float(callback.best_mean_reward), fresh


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("row", choices=sorted(ROWS), help="ENV/ALGO")
    p.add_argument("--seeds", type=int, default=3, help="how many seeds (default 3)")
    p.add_argument("--first-seed", type=int, default=0,
                   help="the first seed: seeds FIRST..FIRST+N-1 (default 0), so that a seed "
                        "left out of an earlier sitting can be run on its own")
    p.add_argument("--fraction", type=float, default=1.0,
                   help="train this fraction of rl-zoo's budget (default 1)")
    p.add_argument("--normalize", action="store_true",
                   help="with VecNormalize (rl-zoo's normalize: true) even where the row "
                        "has none")
    p.add_argument("--eval-episodes", type=int, default=None,
                   help="episodes per evaluation and for the fresh score (default: the "
                        "row's cadence, 20 fresh)")
    args = p.parse_args()
    if not 0 < args.fraction <= 1 or args.seeds < 1 or args.first_seed < 0:
        raise SystemExit("--fraction must be in (0, 1], --seeds >= 1 and --first-seed >= 0")
    import torch

    torch.set_num_threads(1)
    scores = []
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        best, score = train_seed(args.row, seed, args.fraction, args.eval_episodes,
                                 args.normalize)
        scores.append(score)
        print(f"{args.row} SB3 seed {seed}: best while training {best:.1f}, "
              f"fresh {score:.1f}", flush=True)
    spread = f" ± {statistics.pstdev(scores):.1f}" if len(scores) > 1 else ""
    print(f"{args.row} SB3 mean over {len(scores)} seeds: {statistics.fmean(scores):.1f}{spread}")


if __name__ == "__main__":
    main()
