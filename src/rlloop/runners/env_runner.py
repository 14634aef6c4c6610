"""The env runner: batched policy inference + env steps into a rollout buffer."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch import Tensor

from rlloop.data.rollout import RolloutBuffer
from rlloop.envs.core import VecEnv
from rlloop.system.devices import stats_dtype

#: ``policy(obs [N, *obs]) -> (actions, log_probs [N])``, run under inference mode.
PolicyFn = Callable[[Tensor], tuple[Tensor, Tensor]]


class EpisodeTracker:
    """Running return and length per env; keeps the last ``window`` finished episodes.

    Everything stays on ``device`` and :meth:`update` never waits for it: each step's
    running totals and ``done`` flags go into a short log, which is folded into a ring
    of the last ``window`` episodes every ``log_steps`` steps (or when read), without
    ever asking how many episodes ended. :meth:`stats` reads the result in one transfer,
    when a record is written.
    """

    #: Scratch storage, rewritten before it is read (the log is folded in ``get_state``),
    #: and the statistics of the ring as it stands (``stats``).
    transient_attrs: ClassVar[frozenset[str]] = frozenset(
        {"_increment", "_reward", "_log_totals", "_log_done", "_log_rows", "_stats"})

    def __init__(self, num_envs: int, window: int = 100, device: str | torch.device = "cpu",
                 log_steps: int = 64) -> None:
        d = torch.device(device)
        self.window, self.log_steps = window, log_steps
        dtype = stats_dtype(d)
        # Running (return, length) per env; lengths as floats so one op updates both.
        self.totals = torch.zeros((2, num_envs), dtype=dtype, device=d)
        self._increment = torch.ones((2, num_envs), dtype=dtype, device=d)
        self._reward = self._increment[0]
        self._log_totals = torch.zeros((log_steps, 2, num_envs), dtype=dtype, device=d)
        self._log_done = torch.zeros((log_steps, num_envs), dtype=torch.bool, device=d)
        # Row views made once: at small N, indexing per step costs as much as the copies.
        self._log_rows = list(zip(self._log_totals.unbind(0), self._log_done.unbind(0),
                                  strict=True))
        self._logged = 0
        # Slot k holds episode number k (mod window); the extra last slot is a discard
        # target for the log's entries that are not finished episodes.
        self._ring = torch.zeros((window + 1, 2), dtype=dtype, device=d)
        self._episodes = torch.zeros((), dtype=torch.int64, device=d)
        self._slots = torch.arange(window, device=d)
        # On a CPU, where reading a flag waits for nothing, a fold without finished
        # episodes is skipped and the ring's statistics are kept until it changes.
        self._cpu = d.type == "cpu"
        self._stats: dict[str, float] | None = None

    @staticmethod
    def nbytes(num_envs: int, window: int = 100, log_steps: int = 64,
               itemsize: int = 8) -> int:
        """Bytes the tensors of an ``EpisodeTracker(num_envs, window, log_steps=...)``
        hold, for ``itemsize``-byte statistics (8: float64, ``stats_dtype`` off MPS): the
        log of ``log_steps`` x 2 x ``num_envs`` running totals dominates. The memory
        estimate counts it before any is allocated."""
        per_env = (2 + 2 + 2 * log_steps) * itemsize + log_steps  # totals, increment, log
        return num_envs * per_env + (window + 1) * 2 * itemsize + 8 + window * 8

    def update(self, reward: Tensor, done: Tensor) -> None:
        """Add one step's rewards ``[N]``; ``done`` ``[N]`` ends those envs' episodes."""
        self._reward.copy_(reward)
        self.totals += self._increment
        log_totals, log_done = self._log_rows[self._logged]
        log_totals.copy_(self.totals)
        log_done.copy_(done)
        self.totals.masked_fill_(done, 0.0)
        self._logged += 1
        if self._logged == self.log_steps:
            self.fold()

    def restart(self) -> None:
        """Forget the running episodes (their envs were reset); finished ones are kept."""
        self.totals.zero_()

    def fold(self) -> None:
        """Move the logged finished episodes into the ring, oldest first."""
        if not self._logged:
            return
        done = self._log_done[: self._logged].flatten()
        if self._cpu and not bool(done.any()):
            self._logged = 0
            return
        self._stats = None
        totals = self._log_totals[: self._logged].transpose(1, 2).flatten(0, 1)  # [K*N, 2]
        rank = done.cumsum(0)  # 1 for the first finished episode of the log, ...
        count = rank[-1]
        # Only the newest `window` can survive; the others must not share their slots.
        keep = done & (rank > count - self.window)
        slot = torch.where(keep, (self._episodes + rank - 1) % self.window, self.window)
        self._ring.index_copy_(0, slot, totals)
        self._ring[self.window].zero_()  # the discard slot: keep the ring canonical
        self._episodes += count
        self._logged = 0

    def stats(self) -> dict[str, float]:
        """``episode/count`` and, once an episode ended, the mean and max return and the
        mean length of the last ``window`` (the only host synchronisation)."""
        self.fold()
        if self._stats is not None:
            return dict(self._stats)
        filled = self._slots < self._episodes
        n = self._episodes.clamp(1, self.window).to(self._ring.dtype)
        ring = self._ring[: self.window]
        returns, lengths = ring[:, 0], ring[:, 1]
        count, mean, high, length = torch.stack([
            self._episodes.to(ring.dtype), returns.where(filled, 0.0).sum() / n,
            returns.where(filled, -torch.inf).max(), lengths.where(filled, 0.0).sum() / n,
        ]).tolist()
        stats = {"episode/count": count} if not count else {
            "episode/return_mean": mean, "episode/return_max": high,
            "episode/length_mean": length, "episode/count": count}
        if self._cpu:
            self._stats = dict(stats)
        return stats

    def get_state(self) -> dict[str, Any]:
        self.fold()
        return {"returns": self.totals[0].clone(), "lengths": self.totals[1].long(),
                "recent_returns": self._ring[: self.window, 0].clone(),
                "recent_lengths": self._ring[: self.window, 1].long(),
                "episodes": int(self._episodes)}

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`get_state`'s output, or the lists of recent episodes (oldest
        first) that checkpoints of earlier versions hold."""
        self._logged = 0
        self._stats = None
        self.totals[0].copy_(state["returns"])
        self.totals[1].copy_(state["lengths"])
        episodes = int(state["episodes"])
        self._episodes.fill_(episodes)
        recent, lengths = state["recent_returns"], state["recent_lengths"]
        self._ring.zero_()
        if isinstance(recent, Tensor):
            self._ring[: self.window, 0].copy_(recent)
            self._ring[: self.window, 1].copy_(lengths)
            return
        for k, (r, n) in enumerate(zip(recent, lengths, strict=True)):
            slot = (episodes - len(recent) + k) % self.window
            self._ring[slot, 0], self._ring[slot, 1] = float(r), float(n)


class EnvRunner:
    """Steps ``env`` with ``policy``, one forward call per step for all envs.

    The runner owns the current observation, so collection continues across
    iterations exactly where it stopped (episodes are not cut at rollout borders).
    """

    def __init__(self, env: VecEnv, seed: int | None = None,
                 device: str | torch.device = "cpu") -> None:
        self.env = env
        self.device = torch.device(device)
        self.obs = env.reset(seed=seed)
        self.episodes = EpisodeTracker(env.num_envs, device=self.device)
        self.time_env = 0.0
        self.time_inference = 0.0
        #: Set by ``set_state``: the envs must restart their episodes (``restart_due``),
        #: and did so at this resume (``restarted_at_resume``).
        self.restart_due = False
        self.restarted_at_resume = False

    def reset(self, seed: int | None = None) -> None:
        """Start fresh episodes in every env (``horizons_per_env_reset``)."""
        self.obs = self.env.reset(seed=seed)
        self.episodes.restart()

    @torch.inference_mode()
    def collect(self, policy: PolicyFn, buf: RolloutBuffer) -> int:
        """Fill ``buf`` with ``buf.steps`` steps; returns the number of env steps taken."""
        clock = time.perf_counter
        t_env = t_inf = 0.0
        for t, row in enumerate(buf.rows):
            t0 = clock()
            actions, log_probs = policy(self.obs)
            t1 = clock()
            res = self.env.step(actions)
            t2 = clock()
            if row.obs is None:  # Dict observations: stored per entry
                buf.obs[t] = self.obs
            else:
                row.obs.copy_(self.obs)
            row.actions.copy_(actions)
            row.log_probs.copy_(log_probs)
            row.rewards.copy_(res.reward)
            row.terminated.copy_(res.terminated)
            row.truncated.copy_(res.truncated)
            if res.final_obs is not res.obs:  # else no episode ended: nothing to keep
                if row.next_obs is None:
                    buf.next_obs[t] = res.final_obs
                else:
                    row.next_obs.copy_(res.final_obs)
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
        self.obs = state["obs"].to(self.device, copy=True)
        self.episodes.set_state(state["episodes"])
        self.env.set_state(state["env"])
        # An env that could not take back its mid-episode state (Gymnasium envs without
        # `unwrapped.state`, envpool) is where a fresh env is: `obs` would be paired with
        # its next step as one transition. Its episodes restart at the cut instead
        # (`restart_episodes`, once the rest of the state, e.g. observation statistics,
        # is back).
        self.restart_due = not getattr(self.env, "state_restored", True)
        self.restarted_at_resume = False

    def restart_episodes(self) -> None:
        """Reset every env (with its restored RNG) and forget the running episodes."""
        self.reset()
        self.restart_due, self.restarted_at_resume = False, True
