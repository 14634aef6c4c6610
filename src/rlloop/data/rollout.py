"""Preallocated on-policy rollout storage ``[T, N, ...]``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from rlloop.data.batch import TensorBatch
from rlloop.data.obs_storage import ObsLayout, ObsStore


class RolloutBuffer:
    """``T`` steps of ``N`` envs, written in place by the runner every iteration.

    Attributes (shapes):
        obs: ``[T, N, *obs]`` observation the action was taken in.
        actions: ``[T, N, *act]`` (int64 ``[T, N]`` for discrete spaces).
        log_probs: ``[T, N]`` log-probability of the action under the behaviour policy.
        rewards: ``[T, N]``.
        terminated, truncated: ``[T, N]`` bool, the episode ended after step ``t``.
        next_obs: ``[T, N, *obs]`` the *final* observation of an episode that ended after
            step ``t`` (needed to bootstrap truncations), valid only where ``terminated |
            truncated``: a step in which the env reports that no episode ended is not
            copied (the next observation is ``obs[t + 1]``, or the runner's for the last).

    All storage is on ``device``; observations keep the env's dtype (``obs_dtype``: uint8
    frames stay uint8). With an ``obs_layout`` (Dict observations) ``obs`` and
    ``next_obs`` are :class:`~rlloop.data.obs_storage.ObsStore` objects, one tensor per entry
    (image entries uint8), read back as float32 rows: ``buf.obs[:]`` for all of them.
    With ``channels_last`` (image observations ``[C, H, W]``, no ``obs_layout``) ``obs`` is
    stored channels innermost, a permuted view of ``[T, N, H, W, C]`` memory: the layout
    the CNN takes, so the transposition happens once per env step on a few frames
    instead of on every minibatch (indexing keeps the layout).
    """

    def __init__(self, steps: int, num_envs: int, obs_shape: Sequence[int],
                 action_shape: Sequence[int], action_dtype: torch.dtype,
                 device: str | torch.device = "cpu",
                 obs_dtype: torch.dtype = torch.float32,
                 obs_layout: ObsLayout | None = None, *, channels_last: bool = False
                 ) -> None:
        t, n, d = steps, num_envs, torch.device(device)
        self.steps, self.num_envs, self.device = steps, num_envs, d
        self.obs: Tensor | ObsStore
        self.next_obs: Tensor | ObsStore
        if obs_layout is not None:
            self.obs = ObsStore((t, n), obs_layout, d)
            self.next_obs = ObsStore((t, n), obs_layout, d)
        else:
            if channels_last and len(obs_shape) == 3:
                c, h, w = obs_shape
                self.obs = torch.zeros((t, n, h, w, c), dtype=obs_dtype,
                                       device=d).permute(0, 1, 4, 2, 3)
            else:
                self.obs = torch.zeros((t, n, *obs_shape), dtype=obs_dtype, device=d)
            self.next_obs = torch.zeros((t, n, *obs_shape), dtype=obs_dtype, device=d)
        self.actions = torch.zeros((t, n, *action_shape), dtype=action_dtype, device=d)
        self.log_probs = torch.zeros((t, n), device=d)
        self.rewards = torch.zeros((t, n), device=d)
        self.terminated = torch.zeros((t, n), dtype=torch.bool, device=d)
        self.truncated = torch.zeros((t, n), dtype=torch.bool, device=d)
        #: Per step, views of its row of every field, made once: at a few envs, indexing
        #: the seven fields at every step costs as much as the copies into them.
        self.rows = [StepRows(*(None if isinstance(x, ObsStore) else x[i] for x in (  # type: ignore[arg-type]
            self.obs, self.actions, self.log_probs, self.rewards, self.terminated,
            self.truncated, self.next_obs))) for i in range(t)]


class StepRows(NamedTuple):
    """Views of row ``t`` of each of a :class:`RolloutBuffer`'s fields; ``obs`` and
    ``next_obs`` are None where they are :class:`~rlloop.data.obs_storage.ObsStore`
    objects (written as ``buf.obs[t] = rows``)."""

    obs: Tensor | None
    actions: Tensor
    log_probs: Tensor
    rewards: Tensor
    terminated: Tensor
    truncated: Tensor
    next_obs: Tensor | None


@dataclass(frozen=True)
class RolloutBatch(TensorBatch):
    """An on-policy training batch: ``B = T * N`` flat samples, or ``S`` recurrent
    sequences of ``L`` steps (``B = S``, see :mod:`rlloop.data.sequences`) whose
    minibatches take whole sequences (rows).

    Attributes (shapes ``[B]`` flat, ``[S, L]`` for sequences):
        obs: ``[B, *obs]`` / ``[S, L, *obs]``.
        actions: ``[B, *act]`` / ``[S, L, *act]``.
        log_probs: behaviour log-probabilities.
        advantages: GAE advantages.
        returns: value targets (advantages + values).
        values: values at collection time (for value clipping).
        starts: sequences only, ``[S, L]`` bool, the step's observation begins an episode.
        mask: sequences only, ``[S, L]`` bool, False on padding; ``None`` for a flat batch.
        state: sequences only, ``[S, state_size]`` recurrent state entering step 0
            (before its reset).
    """

    obs: Tensor
    actions: Tensor
    log_probs: Tensor
    advantages: Tensor
    returns: Tensor
    values: Tensor
    starts: Tensor | None = None
    mask: Tensor | None = None
    state: Tensor | None = None

    def num_samples(self) -> int | Tensor:
        """The samples trained on: the rows of a flat batch, the real (unpadded) steps of
        sequences (a tensor: counting never waits for the device)."""
        return len(self) if self.mask is None else self.mask.sum()
