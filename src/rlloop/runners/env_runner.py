"""The env runner: batched policy inference + env steps into a rollout buffer."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from rlloop.data.rollout import RolloutBuffer
from rlloop.envs.core import VecEnv

#: ``policy(obs [N, *obs]) -> (actions, log_probs [N])``, run under inference mode.
PolicyFn = Callable[[Tensor], tuple[Tensor, Tensor]]


class EpisodeTracker:
    """Running returns and lengths per env; keeps the last ``window`` finished episodes."""

    def __init__(self, num_envs: int, window: int = 100) -> None:
        self.returns = torch.zeros(num_envs, dtype=torch.float64)
        self.lengths = torch.zeros(num_envs, dtype=torch.int64)
        self.recent_returns: deque[float] = deque(maxlen=window)
        self.recent_lengths: deque[int] = deque(maxlen=window)
        self.episodes = 0

    def update(self, reward: Tensor, done: Tensor) -> None:
        self.returns += reward
        self.lengths += 1
        if bool(done.any()):
            self.recent_returns.extend(self.returns[done].tolist())
            self.recent_lengths.extend(self.lengths[done].tolist())
            self.episodes += int(done.sum())
            self.returns.masked_fill_(done, 0.0)
            self.lengths.masked_fill_(done, 0)

    def stats(self) -> dict[str, float]:
        if not self.recent_returns:
            return {"episode/count": float(self.episodes)}
        r = torch.tensor(list(self.recent_returns), dtype=torch.float64)
        return {
            "episode/return_mean": float(r.mean()),
            "episode/return_max": float(r.max()),
            "episode/length_mean": sum(self.recent_lengths) / len(self.recent_lengths),
            "episode/count": float(self.episodes),
        }

    def get_state(self) -> dict[str, Any]:
        return {"returns": self.returns.clone(), "lengths": self.lengths.clone(),
                "recent_returns": list(self.recent_returns),
                "recent_lengths": list(self.recent_lengths), "episodes": self.episodes}

    def set_state(self, state: dict[str, Any]) -> None:
        self.returns.copy_(state["returns"])
        self.lengths.copy_(state["lengths"])
        self.recent_returns.clear()
        self.recent_returns.extend(float(x) for x in state["recent_returns"])
        self.recent_lengths.clear()
        self.recent_lengths.extend(int(x) for x in state["recent_lengths"])
        self.episodes = int(state["episodes"])


class EnvRunner:
    """Steps ``env`` with ``policy``, one forward call per step for all envs.

    The runner owns the current observation, so collection continues across
    iterations exactly where it stopped (episodes are not cut at rollout borders).
    """

    def __init__(self, env: VecEnv, seed: int | None = None) -> None:
        self.env = env
        self.obs = env.reset(seed=seed)
        self.episodes = EpisodeTracker(env.num_envs)
        self.time_env = 0.0
        self.time_inference = 0.0

    def reset(self, seed: int | None = None) -> None:
        """Start fresh episodes in every env (``horizons_per_env_reset``)."""
        self.obs = self.env.reset(seed=seed)
        self.episodes.returns.zero_()
        self.episodes.lengths.zero_()

    @torch.inference_mode()
    def collect(self, policy: PolicyFn, buf: RolloutBuffer) -> int:
        """Fill ``buf`` with ``buf.steps`` steps; returns the number of env steps taken."""
        clock = time.perf_counter
        t_env = t_inf = 0.0
        for t in range(buf.steps):
            t0 = clock()
            actions, log_probs = policy(self.obs)
            t1 = clock()
            res = self.env.step(actions)
            t2 = clock()
            buf.obs[t] = self.obs
            buf.actions[t] = actions
            buf.log_probs[t] = log_probs
            buf.rewards[t] = res.reward
            buf.terminated[t] = res.terminated
            buf.truncated[t] = res.truncated
            buf.next_obs[t] = res.final_obs
            self.episodes.update(res.reward, res.terminated | res.truncated)
            self.obs = res.obs
            t_inf += t1 - t0
            t_env += t2 - t1
        self.time_env += t_env
        self.time_inference += t_inf
        return buf.steps * buf.num_envs

    def pop_times(self) -> dict[str, float]:
        out = {"time/env_s": self.time_env, "time/inference_s": self.time_inference}
        self.time_env = self.time_inference = 0.0
        return out

    def get_state(self) -> dict[str, Any]:
        return {"obs": self.obs.clone(), "episodes": self.episodes.get_state(),
                "env": self.env.get_state()}

    def set_state(self, state: dict[str, Any]) -> None:
        self.obs = state["obs"].clone()
        self.episodes.set_state(state["episodes"])
        self.env.set_state(state["env"])
