"""Running mean/variance statistics for observation and reward normalisation."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from rlloop.errors import SavedStateError
from rlloop.system.devices import stats_dtype


class RunningMeanStd:
    """Streaming mean and variance (Chan et al.'s parallel update), float64 for stability
    (float32 on MPS, which has no float64), kept on ``device``."""

    def __init__(self, shape: Sequence[int] = (), clip: float = 10.0, eps: float = 1e-8,
                 device: str | torch.device = "cpu") -> None:
        device = torch.device(device)
        self.dtype = stats_dtype(device)
        self.mean = torch.zeros(tuple(shape), dtype=self.dtype, device=device)
        self.var = torch.ones(tuple(shape), dtype=self.dtype, device=device)
        self.count = eps
        self.clip = clip
        self.eps = eps

    def update(self, x: Tensor) -> None:
        """Fold a batch ``[B, *shape]`` into the statistics."""
        x = x.reshape(-1, *self.mean.shape).to(self.dtype)
        b = x.shape[0]
        if b == 0:
            return
        mean, var = x.mean(0), x.var(0, unbiased=False)
        delta = mean - self.mean
        total = self.count + b
        self.mean += delta * b / total
        m2 = self.var * self.count + var * b + delta.pow(2) * self.count * b / total
        self.var = m2 / total
        self.count = total

    def normalize(self, x: Tensor) -> Tensor:
        z = (x - self.mean.to(x.dtype)) / torch.sqrt(self.var.to(x.dtype) + self.eps)
        return z.clamp(-self.clip, self.clip)

    def get_state(self) -> dict[str, Any]:
        return {"mean": self.mean.clone(), "var": self.var.clone(), "count": self.count}

    def set_state(self, state: dict[str, Any]) -> None:
        """Raises ``SavedStateError`` for statistics of another shape than this one's, or a
        count that is not a positive number: they would broadcast into wrong ones."""
        mean, var, count = state["mean"], state["var"], state["count"]
        if not (isinstance(mean, Tensor) and isinstance(var, Tensor)
                and mean.shape == var.shape == self.mean.shape):
            found = [list(t.shape) if isinstance(t, Tensor) else type(t).__name__
                     for t in (mean, var)]
            raise SavedStateError(f"saved normaliser mean and var are {found}, this "
                                  f"normaliser's {list(self.mean.shape)}")
        if not (isinstance(count, int | float) and 0 < count < math.inf):
            raise SavedStateError(f"saved normaliser count is {count!r:.40}, not a positive "
                                  "number")
        # to(): onto this normaliser's device, whichever one the state was saved from
        self.mean = state["mean"].to(self.mean.device, self.dtype, copy=True)
        self.var = state["var"].to(self.var.device, self.dtype, copy=True)
        self.count = float(state["count"])
