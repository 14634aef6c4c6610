"""Rollouts ``[T, N, ...]`` cut into training sequences ``[S, L, ...]`` for recurrent PPO.

Env ``n``'s ``T`` steps become ``K = ceil(T / L)`` consecutive chunks of ``L = seq_len``
steps; the last one is padded with zeros when ``L`` does not divide ``T``, and
:func:`sequence_mask` marks the padding so the loss ignores it. Sequence ``n * K + k`` is
chunk ``k`` of env ``n``. Each sequence starts from the recurrent state stored at its
first step (truncated backpropagation through time); episode starts inside a chunk reset
the state in the forward pass, so chunks need not align with episodes. The sequences
train as a :class:`~rlloop.data.rollout.RolloutBatch` with ``starts``, ``mask`` and
``state`` set.
"""

from __future__ import annotations

import torch
from torch import Tensor


def num_chunks(steps: int, seq_len: int) -> int:
    """``K``: chunks of ``seq_len`` that cover ``steps`` steps."""
    return -(-steps // seq_len)


def to_sequences(x: Tensor, seq_len: int) -> Tensor:
    """``[T, N, *f]`` -> ``[N * K, L, *f]``, zero-padded at the end of each env's last chunk."""
    t, n = x.shape[:2]
    k = num_chunks(t, seq_len)
    pad = k * seq_len - t
    if pad:
        x = torch.cat([x, x.new_zeros((pad, *x.shape[1:]))])
    x = x.reshape(k, seq_len, n, *x.shape[2:])
    return x.transpose(0, 2).transpose(1, 2).flatten(0, 1)  # [N, K, L, *f] -> [N*K, L, *f]


def sequence_mask(steps: int, num_envs: int, seq_len: int, device: torch.device) -> Tensor:
    """``[N * K, L]`` bool: True for real steps, False for padding."""
    k = num_chunks(steps, seq_len)
    valid = torch.arange(k * seq_len, device=device) < steps
    return valid.reshape(1, k, seq_len).expand(num_envs, k, seq_len).flatten(0, 1)


def chunk_states(states: Tensor, seq_len: int) -> Tensor:
    """The state entering each sequence: ``[T, N, S]`` -> ``[N * K, S]``."""
    return states[::seq_len].transpose(0, 1).flatten(0, 1)
