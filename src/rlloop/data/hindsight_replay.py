"""Hindsight experience replay (HER; Andrychowicz et al. 2017, arXiv:1707.01495).

In a goal-conditioned env (a Dict observation with ``observation``, ``achieved_goal`` and
``desired_goal`` entries, and a ``compute_reward(achieved, desired, info)`` that scores any
pair) an episode that missed its goal still reached other states. A sampled transition
is *relabelled*: its ``desired_goal`` (in ``obs`` and ``next_obs``) is replaced by a goal
the same episode achieved, and its reward recomputed for that goal, so that failures teach
how to reach what was reached.

The buffer keeps ``capacity // num_envs`` rows per env, one row per env step, and the
episode each row belongs to; the envs step in lockstep, so row ``r`` of every env is
written by the same ``add``. Bookkeeping is in absolute step counts: a row holds its
episode's first step and its episode's number; a ring of episode ends (one per env)
says when each episode finished (-1: still running). Only transitions of finished
episodes whose first step is still held are sampled, as Stable-Baselines3's
``HerReplayBuffer`` does (an overwritten episode start drops the rest of that episode).
A batch holds ``int(B * n/(n+1))`` relabelled transitions first, then the real ones, with
``n = n_sampled_goal``. Every update is a few tensor ops over ``[num_envs]``; no Python loop
runs per env or per transition.

With ``keep_infos`` each step's ``info`` dicts are kept too (:mod:`rlloop.data.info_storage`)
and the relabelled transitions' infos are passed to ``compute_reward``, for rewards that
read them (Stable-Baselines3's ``copy_info_dict=True``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import torch
from torch import Tensor

from rlloop.data.info_storage import InfoStore
from rlloop.data.obs_storage import ObsLayout, ObsStore
from rlloop.data.replay import check_fits
from rlloop.data.transitions import Transitions

#: ``compute_reward(achieved [B, G], desired [B, G]) -> [B]`` float32, on their device;
#: with ``keep_infos``, ``compute_reward(achieved, desired, infos)``, ``infos`` a ``[B]``
#: object array of the transitions' info dicts.
GoalReward = Callable[..., Tensor]
Strategy = Literal["future", "final", "episode"]
STRATEGIES: tuple[str, ...] = ("future", "final", "episode")
#: The Dict entries HER reads and rewrites.
ACHIEVED, DESIRED = "achieved_goal", "desired_goal"
_NEVER = -(2**62)  # episode start of a row never written: never sampled


class HindsightReplayBuffer:
    """Uniform replay of finished episodes' transitions, a share of them relabelled.

    Args:
        capacity: Transitions kept (``max(capacity // num_envs, 1)`` per env).
        num_envs: Envs whose one-step transitions arrive together, env ``i`` in row ``i``.
        layout: The Dict observation's entries (with ``achieved_goal`` and
            ``desired_goal`` of one shape).
        action_shape, action_dtype, device: As for ``ReplayBuffer``.
        compute_reward: The env's reward for an achieved and a desired goal, batched.
        n_sampled_goal: Relabelled transitions per real one.
        strategy: Which achieved goal relabels a transition at step ``t`` of an episode
            of ``L`` steps: "future" (the one after a step in ``[t, L)``, inclusive as
            SB3's), "final" (after step ``L - 1``) or "episode" (after one in ``[0, L)``).
        keep_infos: Keep each step's info dicts (``add``'s ``infos``) and pass those of
            the relabelled transitions to ``compute_reward``.
    """

    def __init__(self, capacity: int, num_envs: int, layout: ObsLayout,
                 action_shape: tuple[int, ...], action_dtype: torch.dtype,
                 compute_reward: GoalReward, n_sampled_goal: int = 4,
                 strategy: Strategy = "future", device: torch.device | str = "cpu",
                 keep_infos: bool = False) -> None:
        names = {name: shape for name, shape, _ in layout.entries}
        if ACHIEVED not in names or DESIRED not in names or names[ACHIEVED] != names[DESIRED]:
            raise ValueError(f"HER needs '{ACHIEVED}' and '{DESIRED}' entries of one shape, "
                             f"got {names}")
        if n_sampled_goal < 1 or strategy not in STRATEGIES:
            raise ValueError(f"HER needs n_sampled_goal >= 1 and a strategy of {STRATEGIES}, "
                             f"got {n_sampled_goal} and {strategy!r}")
        self.capacity, self.num_envs, self.layout = capacity, num_envs, layout
        self.rows = rows = max(capacity // num_envs, 1)
        self.compute_reward, self.strategy = compute_reward, strategy
        self.her_ratio = 1 - 1 / (n_sampled_goal + 1)
        self.device = d = torch.device(device)
        n = num_envs
        action_bytes = math.prod(action_shape) * torch.empty((), dtype=action_dtype).element_size()
        # per row: obs and next obs, action, reward, terminated, discount, ep_start, ep_id;
        # and per episode slot (rows + 1 of them per env) its end step
        self.nbytes = (n * rows * (2 * layout.bytes_per_obs + action_bytes + 4 + 1 + 4 + 8 + 8)
                       + (rows + 1) * n * 8)
        check_fits("HER replay", capacity, self.nbytes, d)
        self.obs = ObsStore((rows, n), layout, d)
        self.next_obs = ObsStore((rows, n), layout, d)
        self._fields = {
            "action": torch.zeros((rows, n, *action_shape), dtype=action_dtype, device=d),
            "reward": torch.zeros((rows, n), device=d),
            "terminated": torch.zeros((rows, n), dtype=torch.bool, device=d),
            "discount": torch.zeros((rows, n), device=d),
            # per row: its episode's first step (absolute) and its episode's number
            "ep_start": torch.full((rows, n), _NEVER, dtype=torch.int64, device=d),
            "ep_id": torch.zeros((rows, n), dtype=torch.int64, device=d),
        }
        # Episode k of env e ends (absolute step, exclusive) at ends[k % (rows + 1), e]; an
        # episode that still has a row held started less than ``rows`` episodes ago, so a
        # ring of rows + 1 never reuses the slot of one that can be sampled.
        self._ends = torch.full((rows + 1, n), -1, dtype=torch.int64, device=d)
        self._env = torch.arange(n, device=d)
        self._start = torch.zeros(n, dtype=torch.int64, device=d)  # running episodes
        self._episode = torch.zeros(n, dtype=torch.int64, device=d)
        self._written = 0  # env steps added (per env), absolute
        self._ended = False  # whether an episode has ended (read back once, then kept)
        self.infos = InfoStore(rows, n, d) if keep_infos else None

    def __len__(self) -> int:
        """Transitions held, or 0 while no episode has ended (nothing can be sampled yet:
        the off-policy loop skips its optimisation steps until then)."""
        if not self._ended:  # a host sync per call until the first episode ends
            self._ended = bool((self._ends >= 0).any())
        return min(self._written, self.rows) * self.num_envs if self._ended else 0

    def add(self, batch: Transitions, infos: Sequence[Mapping[str, Any]] | None = None
            ) -> Tensor:
        """Add one env step: ``[num_envs, ...]`` one-step transitions, env ``i`` in row
        ``i`` (and with ``keep_infos`` the step's ``infos``, one dict per env); returns
        ``[num_envs]`` int64, the flat indices written. Call :meth:`end_episodes` after it
        with the step's ``done`` flags.

        Raises:
            UnstorableInfo: an info entry is no number, bool or numeric array (nothing of
                the step is added).
        """
        if batch.reward.shape[0] != self.num_envs:
            raise ValueError(f"HER replay takes one transition per env ({self.num_envs}) "
                             f"per add, got {batch.reward.shape[0]}")
        row = self._written % self.rows
        if self.infos is not None:
            if infos is None:
                raise ValueError("this HER replay keeps infos (keep_infos=True): pass the "
                                 "step's infos to add")
            self.infos.write(row, infos)
        self.obs[row], self.next_obs[row] = batch.obs, batch.next_obs
        f = self._fields
        for name in ("action", "reward", "terminated", "discount"):
            f[name][row] = getattr(batch, name)
        f["ep_start"][row], f["ep_id"][row] = self._start, self._episode
        self._written += 1
        return row * self.num_envs + self._env

    def end_episodes(self, done: Tensor) -> None:
        """The last step added ended the episodes of the envs where ``done`` ``[N]`` (an
        episode without steps, as after a resume that restarted the envs, stays open)."""
        done = done & (self._start < self._written)
        ring = self.rows + 1
        slot = self._episode % ring
        self._ends[slot, self._env] = torch.where(done, self._written, self._ends[slot, self._env])
        self._episode += done
        self._start = torch.where(done, self._written, self._start)
        slot = self._episode % ring
        self._ends[slot, self._env] = torch.where(done, -1, self._ends[slot, self._env])

    def _episodes(self, row: Tensor, env: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``(first step, length, step)`` (absolute steps) of the transitions at ``row``,
        ``env``; length <= 0 for an episode still running."""
        start = self._fields["ep_start"][row, env]
        end = self._ends[self._fields["ep_id"][row, env] % (self.rows + 1), env]
        step = row + self.rows * torch.div(self._written - 1 - row, self.rows,
                                           rounding_mode="floor")
        return start, end - start, step

    def spans(self) -> tuple[Tensor, Tensor]:
        """``(first, end)`` ``[num_envs]`` absolute steps: the transitions a batch may hold
        (of finished episodes whose first step is still held) are, per env, the steps in
        ``[first, end)``. Episodes follow each other, so they are one run: from the first
        episode that starts at or after the oldest row held, up to the running episode."""
        oldest = max(self._written - self.rows, 0)
        row = oldest % self.rows
        start = self._fields["ep_start"][row]
        end_of_oldest = self._ends[self._fields["ep_id"][row] % (self.rows + 1), self._env]
        first = torch.where(start >= oldest, start, end_of_oldest)
        first = torch.where(first < 0, self._start, first)  # the oldest one still runs
        return first, torch.maximum(first, self._start)

    def sampleable(self) -> Tensor:
        """``[rows, num_envs]`` bool: whether each transition may be sampled."""
        rows = torch.arange(self.rows, device=self.device)[:, None]
        step = rows + self.rows * torch.div(self._written - 1 - rows, self.rows,
                                            rounding_mode="floor")
        first, end = self.spans()
        return (step >= first) & (step < end) & (rows < self._written)

    def goal_steps(self, row: Tensor, env: Tensor, draw: Tensor) -> Tensor:
        """Index in its episode of the step whose achieved goal relabels each transition,
        from ``draw`` ``[B]`` float64 uniform in [0, 1) (unused by "final")."""
        start, length, step = self._episodes(row, env)
        if self.strategy == "final":
            return length - 1
        low = step - start if self.strategy == "future" else torch.zeros_like(length)
        return low + (draw * (length - low)).long()

    def sample(self, batch_size: int, generator: torch.Generator | None = None) -> Transitions:
        """``batch_size`` transitions of finished episodes drawn uniformly with
        replacement, the first ``int(batch_size * n/(n+1))`` relabelled."""
        if not len(self):
            raise ValueError(
                f"HER samples finished episodes only, and none has ended in the "
                f"{self._written} steps per env so far; raise learning_starts above the "
                "episode length times num_envs")
        # Uniform over the sampleable transitions: an index into all envs' spans, laid
        # end to end, without a host sync (SB3 draws from the list of valid rows).
        first, end = self.spans()
        counts = end - first
        ends = counts.cumsum(0)
        gen_device = generator.device if generator is not None else self.device
        draws = torch.rand((2, batch_size), generator=generator, dtype=torch.float64,
                           device=gen_device).to(self.device)
        index = (draws[0] * ends[-1]).long()
        env = torch.searchsorted(ends, index, right=True)
        row = (first[env] + index - (ends - counts)[env]) % self.rows
        n_virtual = int(self.her_ratio * batch_size)
        return self.relabelled(row, env, self.goal_steps(row, env, draws[1])[:n_virtual])

    def relabelled(self, row: Tensor, env: Tensor, goal_step: Tensor) -> Transitions:
        """The transitions at ``row``, ``env`` ``[B]``; the first ``len(goal_step)`` of them
        relabelled with the goal achieved after step ``goal_step`` of their episode."""
        n = len(goal_step)
        obs = {k: t[row, env] for k, t in self.obs.tensors.items()}
        next_obs = {k: t[row, env] for k, t in self.next_obs.tensors.items()}
        reward = self._fields["reward"][row, env]
        if n:
            start = self._fields["ep_start"][row[:n], env[:n]]
            goal_row = (start + goal_step) % self.rows
            goal = self.next_obs.tensors[ACHIEVED][goal_row, env[:n]]
            obs[DESIRED] = torch.cat([goal, obs[DESIRED][n:]])
            next_obs[DESIRED] = obs[DESIRED]
            # r_t rewards s_{t+1}: the goal achieved after the step, as SB3 and the paper
            if self.infos is None:
                new = self.compute_reward(next_obs[ACHIEVED][:n], goal)
            else:
                infos = self.infos.read(row[:n], env[:n])
                new = self.compute_reward(next_obs[ACHIEVED][:n], goal, infos)
            new = new.to(reward.dtype)
            reward = torch.cat([new.reshape(n), reward[n:]])
        f = self._fields
        return Transitions(obs=self.layout.join(obs), action=f["action"][row, env],
                           reward=reward, next_obs=self.layout.join(next_obs),
                           terminated=f["terminated"][row, env],
                           discount=f["discount"][row, env],
                           indices=row * self.num_envs + env)

    def get_state(self) -> dict[str, Any]:
        """Contents and counters; the row tensors are views of the live storage up to the
        rows written (serialise before the next ``add``)."""
        held = min(self._written, self.rows)
        state: dict[str, Any] = {f"obs.{k}": t[:held] for k, t in self.obs.tensors.items()}
        state.update({f"next_obs.{k}": t[:held] for k, t in self.next_obs.tensors.items()})
        state.update({k: t[:held] for k, t in self._fields.items()})
        state.update(ends=self._ends, start=self._start, episode=self._episode,
                     written=self._written, capacity=self.capacity)
        if self.infos is not None:
            state["infos"] = self.infos.get_state(held)
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        if int(state["capacity"]) != self.capacity:
            raise ValueError(f"replay state has capacity {state['capacity']} but this buffer "
                             f"has {self.capacity}; build the buffer with the saved capacity")
        stores = {**{f"obs.{k}": t for k, t in self.obs.tensors.items()},
                  **{f"next_obs.{k}": t for k, t in self.next_obs.tensors.items()},
                  **self._fields}
        for name, store in stores.items():
            value = state[name]
            if value.shape[1:] != store.shape[1:] or value.shape[0] > self.rows:
                raise ValueError(f"HER replay state '{name}' has shape {tuple(value.shape)}; "
                                 f"was it saved with another num_envs?")
            store[: value.shape[0]] = value.to(self.device)
        for name in ("ends", "start", "episode"):
            getattr(self, f"_{name}").copy_(state[name])
        if self.infos is not None:
            if "infos" not in state:
                raise ValueError("this replay state holds no infos (saved without keeping "
                                 "them); build the buffer with keep_infos=False")
            self.infos.set_state(state["infos"])
        self._written = int(state["written"])
        self._ended = False
