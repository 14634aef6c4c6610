"""Target-network updates."""

from __future__ import annotations

import torch
from torch import Tensor, nn


def _paired(target: nn.Module, source: nn.Module, kind: str) -> tuple[list[Tensor], list[Tensor]]:
    t = list(target.parameters() if kind == "parameters" else target.buffers())
    s = list(source.parameters() if kind == "parameters" else source.buffers())
    if len(t) != len(s):
        raise ValueError(
            f"target has {len(t)} {kind} but source has {len(s)}; "
            "the target network must be a copy of the source (copy.deepcopy)"
        )
    return t, s


@torch.no_grad()
def polyak_update(target: nn.Module, source: nn.Module, tau: float) -> None:
    """``theta_targ <- (1 - tau) theta_targ + tau theta`` for every parameter, in place.

    Buffers (e.g. batch-norm running statistics) are copied, not averaged, as
    Stable-Baselines3 does for its target networks.
    """
    if not 0.0 <= tau <= 1.0:
        raise ValueError(f"tau must be in [0, 1], got {tau}")
    for t, s in zip(*_paired(target, source, "parameters"), strict=True):
        t.lerp_(s, tau)
    for t, s in zip(*_paired(target, source, "buffers"), strict=True):
        t.copy_(s)


@torch.no_grad()
def hard_update(target: nn.Module, source: nn.Module) -> None:
    """Copy every parameter and buffer of ``source`` into ``target``, in place."""
    for kind in ("parameters", "buffers"):
        for t, s in zip(*_paired(target, source, kind), strict=True):
            t.copy_(s)
