"""Trajectory collection over a worker pool with batched inference (``ml``'s ``iter_samples``).

The rules, per env:

* A trajectory ends when its episode ends (terminated or truncated by the env), when it
  reaches ``max_trajectory_length`` (then it is cut: its last sample is marked
  ``truncated`` and the env is reset), or when its worker is restarted (then it is
  dropped: it may have been corrupted by the failure).
* Trajectories shorter than ``min_trajectory_length`` are discarded with a warning and
  do not count towards ``total_samples``.
* Collection stops once the counted samples reach ``total_samples``. When the finished
  trajectories plus the unfinished ones that are long enough would reach it, just enough
  unfinished ones are cut (their last sample marked ``truncated``, so the value of the
  next observation can still be bootstrapped) and collection ends.

So every returned trajectory is at least ``min_trajectory_length`` long and ends with a
sample that has ``terminated`` or ``truncated`` set.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlloop.envs.pool import Ready, WorkerPool

_log = logging.getLogger(__name__)

ActFn = Callable[[list[Any]], Sequence[Any]]
"""``act(observations) -> one action per observation``: one forward pass per batch."""


@dataclass
class Sample:
    """One env step of a trajectory.

    Attributes:
        obs: The observation the action was chosen on.
        action: The action, as sent to the env.
        reward: Reward received for it.
        next_obs: The observation after it (the episode's last one if it ended here).
        terminated: The episode ended in a terminal state here (no bootstrap).
        truncated: The trajectory was cut here: by the env's time limit, by
            ``max_trajectory_length`` or at the end of collection (bootstrap from
            ``next_obs``).
    """

    obs: Any
    action: Any
    reward: float
    next_obs: Any
    terminated: bool
    truncated: bool


@dataclass
class SamplingStats:
    """Counters of one collection; :meth:`as_stats` gives flat, namespaced metrics."""

    samples: int = 0
    trajectories: int = 0
    discarded: int = 0
    dropped: int = 0
    batches: int = 0
    batch_size_sum: int = 0
    batch_size_max: int = 0
    batch_size_min: int = 0
    episode_returns: list[float] = field(default_factory=list)

    def add_batch(self, size: int) -> None:
        self.batch_size_min = size if not self.batches else min(self.batch_size_min, size)
        self.batches += 1
        self.batch_size_sum += size
        self.batch_size_max = max(self.batch_size_max, size)

    def as_stats(self) -> dict[str, float]:
        returns = self.episode_returns
        stats = {
            "sampling/samples": float(self.samples),
            "sampling/trajectories": float(self.trajectories),
            "sampling/discarded_trajectories": float(self.discarded),
            "sampling/dropped_trajectories": float(self.dropped),
            "sampling/batch_size_mean": self.batch_size_sum / max(self.batches, 1),
            "sampling/batch_size_max": float(self.batch_size_max),
            "episode/count": float(len(returns)),
        }
        if returns:
            stats["episode/return_mean"] = math.fsum(returns) / len(returns)
            stats["episode/return_max"] = max(returns)
        return stats


def check_sampling_args(num_slots: int, total_samples: int | None, min_trajectory_length: int,
                        max_trajectory_length: int | None, min_batch_size: int,
                        max_batch_size: int | None) -> int:
    """Validate like ``ml`` does (plus the obvious checks); returns the effective max batch."""
    max_batch = num_slots if max_batch_size is None else min(max_batch_size, num_slots)
    if total_samples is not None and min_trajectory_length > total_samples:
        raise ValueError(f"min_trajectory_length={min_trajectory_length} > "
                         f"total_samples={total_samples}")
    if min_batch_size > max_batch:
        raise ValueError(f"min_batch_size={min_batch_size} > max_batch_size={max_batch}")
    if min_batch_size < 1:
        raise ValueError(f"min_batch_size must be >= 1, got {min_batch_size}")
    if max_trajectory_length is not None and max_trajectory_length < min_trajectory_length:
        raise ValueError(f"max_trajectory_length={max_trajectory_length} < "
                         f"min_trajectory_length={min_trajectory_length}: every trajectory "
                         "would be discarded")
    return max_batch


def iter_trajectories(
    pool: WorkerPool,
    act: ActFn,
    *,
    total_samples: int | None,
    min_trajectory_length: int = 1,
    max_trajectory_length: int | None = None,
    min_batch_size: int = 1,
    max_batch_size: int | None = None,
    max_wait_time: float | None = None,
    stats: SamplingStats | None = None,
    should_stop: Callable[[], bool] | None = None,
    seeds: Sequence[int] | None = None,
) -> Iterator[list[Sample]]:
    """Yield trajectories from ``pool`` (see the module doc for the rules).

    Arguments are validated here, before anything runs. ``total_samples=None`` samples
    forever; ``should_stop`` ends collection early (e.g. on SIGTERM) without flushing,
    even while a worker is slow to answer. Every env starts a new episode first,
    reseeded from ``seeds`` (one per env) if given.

    Raises:
        ValueError: ``min_trajectory_length > total_samples`` or
            ``min_batch_size > max_batch_size`` (as in ``ml``), and other impossible values.
    """
    max_batch = check_sampling_args(pool.num_slots, total_samples, min_trajectory_length,
                                    max_trajectory_length, min_batch_size, max_batch_size)
    return _collect(pool, act, total_samples, max(min_trajectory_length, 1),
                    max_trajectory_length, min_batch_size, max_batch, max_wait_time,
                    stats if stats is not None else SamplingStats(), should_stop, seeds)


def _collect(pool: WorkerPool, act: ActFn, total: int | None, min_len: int,
             max_len: int | None, min_batch: int, max_batch: int, max_wait: float | None,
             stats: SamplingStats, should_stop: Callable[[], bool] | None,
             seeds: Sequence[int] | None) -> Iterator[list[Sample]]:
    n = pool.num_slots
    trajs: list[list[Sample]] = [[] for _ in range(n)]
    pending: list[tuple[Any, Any] | None] = [None] * n  # (obs, action) awaiting its outcome
    returns = [0.0] * n
    pool.reset(seeds)
    while total is None or stats.samples < total:
        # next_batch returns at once (maybe empty) when a stop is asked for while it waits
        batch = pool.next_batch(min_batch, max_batch, max_wait, should_stop)
        if should_stop is not None and should_stop():
            return
        stats.add_batch(len(batch))
        finished: list[list[Sample]] = []
        act_on: list[Ready] = []
        resets: list[Ready] = []
        for ready in batch:
            s, out = ready.slot, ready.outcome
            step = pending[s]
            pending[s] = None
            if ready.restarted:
                stats.dropped += bool(trajs[s])
                trajs[s], returns[s] = [], 0.0
            elif step is not None:
                trajs[s].append(Sample(step[0], step[1], out.reward, out.final_obs,
                                       out.terminated, out.truncated))
                returns[s] += out.reward
                cut = max_len is not None and len(trajs[s]) >= max_len
                if out.terminated or out.truncated or cut:
                    trajs[s][-1].truncated |= cut and not out.terminated
                    finished.append(trajs[s])
                    stats.episode_returns.append(returns[s])
                    trajs[s], returns[s] = [], 0.0
                    if cut and not (out.terminated or out.truncated):
                        resets.append(ready)  # its obs continues the cut episode: reset instead
                        continue
            act_on.append(ready)
        for trajectory in finished:
            if len(trajectory) < min_len:
                stats.discarded += 1
                _log.warning("discarding a trajectory of length %d < min_trajectory_length=%d",
                             len(trajectory), min_len)
                continue
            stats.samples += len(trajectory)
            stats.trajectories += 1
            yield trajectory
        if total is not None and stats.samples < total:
            long_enough = [s for s in range(n) if len(trajs[s]) >= min_len]
            if stats.samples + sum(len(trajs[s]) for s in long_enough) >= total:
                yield from _flush(trajs, long_enough, total, stats)
                return
        if total is not None and stats.samples >= total:
            return
        # The whole batch is one inference call (it holds at least min_batch_size states);
        # an env whose trajectory was just cut is reset instead of stepped.
        states = [r.outcome.obs for r in (*act_on, *resets)]
        actions = list(act(states)) if states else []
        if len(actions) != len(states):
            raise ValueError(f"get_actions returned {len(actions)} actions for "
                             f"{len(states)} states")
        for ready, action in zip(act_on, actions, strict=False):
            pending[ready.slot] = (ready.outcome.obs, action)
        pool.send([*act_on, *resets], [*actions[:len(act_on)], *([None] * len(resets))])


def _flush(trajs: list[list[Sample]], slots: list[int], total: int,
           stats: SamplingStats) -> Iterator[list[Sample]]:
    """Cut just enough unfinished trajectories to reach ``total``."""
    for s in slots:
        if stats.samples >= total:
            return
        trajectory = trajs[s]
        trajectory[-1].truncated = True
        stats.samples += len(trajectory)
        stats.trajectories += 1
        yield trajectory
