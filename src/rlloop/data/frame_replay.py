"""A replay buffer for frame-stacked pixels that stores each frame once.

With 4 stacked 84x84 frames an observation is 28 KB, and a plain replay buffer keeps
two per transition (``obs`` and ``next_obs``): 56 KB, although consecutive stacks share
three frames and ``next_obs`` is the next transition's ``obs``. This buffer keeps one
ring of frames per env and, per transition, the ring position of its observation's
newest frame; both stacks are read back from the ring when sampled.

Which frames to write is found by comparing stacks, so nothing but the observations is
needed: a transition whose ``obs`` equals the previous transition's ``next_obs`` (of the
same env) continues it and adds one frame (its ``next_obs``'s newest); any other writes
its whole ``obs`` stack first (an episode start). The stacks read back are therefore
bit-identical to the ones added. Frames take ``capacity * (1 + 1/8)`` slots plus a few
per env: an episode start costs ``stack`` extra frames, and when episodes are so short
that the ring fills first, the oldest transitions leave early (``len`` counts the ones
kept).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from rlloop.data.replay import check_fits
from rlloop.data.transitions import Transitions


class FrameReplayBuffer:
    """Uniform replay of one-step transitions between frame stacks ``[stack, *frame]``.

    Args:
        capacity: Transitions kept (``ceil(capacity / num_envs)`` per env).
        obs_shape: ``(stack, *frame_shape)``, e.g. ``(4, 84, 84)``.
        num_envs: Envs whose transitions arrive together, one row each, in env order.
        action_shape, action_dtype, device, obs_dtype: As for ``ReplayBuffer``.

    Raises:
        ReplayMemoryError: the storage would not fit in memory on ``device``.
    """

    def __init__(self, capacity: int, obs_shape: tuple[int, ...], num_envs: int,
                 action_shape: tuple[int, ...], action_dtype: torch.dtype,
                 device: torch.device | str = "cpu", obs_dtype: torch.dtype = torch.uint8
                 ) -> None:
        if capacity < 1 or len(obs_shape) < 2:
            raise ValueError(f"frame replay needs capacity >= 1 and stacked frames, got "
                             f"{capacity} and {obs_shape}")
        self.capacity, self.num_envs = capacity, num_envs
        self.obs_shape, self.stack = tuple(obs_shape), obs_shape[0]
        self.device = torch.device(device)
        n, per_env = num_envs, math.ceil(capacity / num_envs)
        self.per_env = per_env
        self.frames_per_env = per_env + per_env // 8 + 2 * self.stack + 2
        frame_bytes = math.prod(obs_shape[1:]) * obs_dtype.itemsize
        act_bytes = math.prod(action_shape) * action_dtype.itemsize
        self.nbytes = (n * self.frames_per_env * frame_bytes
                       + n * per_env * (act_bytes + 4 + 1 + 4 + 8))
        check_fits("frame replay", capacity, self.nbytes, self.device)
        d = self.device
        self.frames = torch.zeros((n, self.frames_per_env, *obs_shape[1:]), dtype=obs_dtype,
                                  device=d)
        self._fields = {
            "action": torch.zeros((n, per_env, *action_shape), dtype=action_dtype, device=d),
            "reward": torch.zeros((n, per_env), device=d),
            "terminated": torch.zeros((n, per_env), dtype=torch.bool, device=d),
            "discount": torch.zeros((n, per_env), device=d),
            "pos": torch.zeros((n, per_env), dtype=torch.int64, device=d),
        }
        # Host-side counters per env, absolute (never wrapped): frames and transitions
        # written, the oldest transition kept, and the newest transition's frame position.
        self._frame_count = [0] * n
        self._written = [0] * n
        self._first = [0] * n
        self._last_pos = [-1] * n

    def __len__(self) -> int:
        return sum(w - f for w, f in zip(self._written, self._first, strict=True))

    def _ring(self, env: int, start: int, count: int) -> Tensor:
        idx = torch.arange(start, start + count, device=self.device) % self.frames_per_env
        return self.frames[env, idx]

    def _write_frames(self, env: int, frames: Tensor) -> None:
        for frame in frames:
            self.frames[env, self._frame_count[env] % self.frames_per_env] = frame
            self._frame_count[env] += 1

    def add(self, batch: Transitions) -> Tensor:
        """Add one transition per env (``[num_envs, ...]`` fields, env ``i`` in row ``i``);
        returns ``[num_envs]`` int64, the slot each was written to in its env's ring."""
        if batch.reward.shape[0] != self.num_envs:
            raise ValueError(f"frame replay takes one transition per env ({self.num_envs}), "
                             f"got {batch.reward.shape[0]}")
        s, k = self.stack, self.stack - 1
        slots = []
        for env in range(self.num_envs):
            obs, nxt = batch.obs[env], batch.next_obs[env]
            if not torch.equal(obs[1:], nxt[:-1]):
                raise ValueError("frame replay needs frame-stacked observations (next_obs "
                                 "[:-1] equal to obs[1:]); use replay=uniform for this env")
            last = self._last_pos[env]
            if last >= 0 and torch.equal(obs, self._ring(env, last - k + 1, s)):
                pos = last + 1  # the previous transition's next frame is this obs's newest
            else:
                self._write_frames(env, obs)
                pos = self._frame_count[env] - 1
            self._write_frames(env, nxt[-1:])
            slot = self._written[env] % self.per_env
            slots.append(slot)
            for name in ("action", "reward", "terminated", "discount"):
                self._fields[name][env, slot] = getattr(batch, name)[env]
            self._fields["pos"][env, slot] = pos
            self._last_pos[env] = pos
            self._written[env] += 1
            self._drop_overwritten(env)
        return torch.tensor(slots, dtype=torch.int64, device=self.device)

    def _drop_overwritten(self, env: int) -> None:
        """Advance past transitions whose slot or oldest frame was overwritten."""
        oldest_frame = self._frame_count[env] - self.frames_per_env
        first = max(self._first[env], self._written[env] - self.per_env)
        pos = self._fields["pos"][env]
        while first < self._written[env] and \
                int(pos[first % self.per_env]) - (self.stack - 1) < oldest_frame:
            first += 1
        self._first[env] = first

    def sample(self, batch_size: int, generator: torch.Generator | None = None) -> Transitions:
        """``batch_size`` transitions drawn uniformly with replacement."""
        total = len(self)
        if total == 0:
            raise ValueError("cannot sample from an empty replay buffer; add transitions first")
        gen_device = generator.device if generator is not None else self.device
        rows = torch.randint(total, (batch_size,), generator=generator,
                             device=gen_device).to(self.device)
        counts = torch.tensor([w - f for w, f in zip(self._written, self._first, strict=True)],
                              device=self.device)
        ends = counts.cumsum(0)
        env = torch.searchsorted(ends, rows, right=True)
        offset = rows - (ends - counts)[env]
        first = torch.tensor(self._first, device=self.device)[env]
        slot = (first + offset) % self.per_env
        pos = self._fields["pos"][env, slot]
        steps = torch.arange(-(self.stack - 1), 2, device=self.device)  # obs frames, then next
        frames = self.frames[env[:, None], (pos[:, None] + steps) % self.frames_per_env]
        f = self._fields
        return Transitions(obs=frames[:, :-1], action=f["action"][env, slot],
                           reward=f["reward"][env, slot], next_obs=frames[:, 1:],
                           terminated=f["terminated"][env, slot],
                           discount=f["discount"][env, slot], indices=rows)

    def get_state(self) -> dict[str, Any]:
        """Contents and counters: the frames written so far (up to the ring size) and every
        transition field, views of the live storage (serialise before the next ``add``)."""
        filled = min(max(self._frame_count), self.frames_per_env)
        return {"frames": self.frames[:, :filled], **self._fields,
                "counters": torch.tensor([self._frame_count, self._written, self._first,
                                          self._last_pos], dtype=torch.int64),
                "capacity": self.capacity}

    def set_state(self, state: dict[str, Any]) -> None:
        if int(state["capacity"]) != self.capacity:
            raise ValueError(f"replay state has capacity {state['capacity']} but this buffer "
                             f"has {self.capacity}; build the buffer with the saved capacity")
        frames = state["frames"]
        self.frames[:, : frames.shape[1]] = frames.to(self.device)
        for name, store in self._fields.items():
            store.copy_(state[name])
        counters = state["counters"].tolist()
        self._frame_count, self._written, self._first, self._last_pos = counters
