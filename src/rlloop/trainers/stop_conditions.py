"""Stop conditions: small callables over the flat stats dict (rl8's design).

``Trainer.run`` stops as soon as any condition returns ``True``.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from typing import Protocol


class Condition(Protocol):
    def __call__(self, stats: Mapping[str, float]) -> bool: ...


class HitsUpperBound:
    """True once ``stats[key] >= bound``."""

    def __init__(self, key: str, bound: float) -> None:
        self.key, self.bound = key, bound

    def __call__(self, stats: Mapping[str, float]) -> bool:
        value = stats.get(self.key)
        return value is not None and not math.isnan(value) and value >= self.bound

    def __repr__(self) -> str:
        return f"HitsUpperBound({self.key!r}, {self.bound})"


class HitsLowerBound:
    """True once ``stats[key] <= bound``."""

    def __init__(self, key: str, bound: float) -> None:
        self.key, self.bound = key, bound

    def __call__(self, stats: Mapping[str, float]) -> bool:
        value = stats.get(self.key)
        return value is not None and not math.isnan(value) and value <= self.bound

    def __repr__(self) -> str:
        return f"HitsLowerBound({self.key!r}, {self.bound})"


class Plateaus:
    """True once ``stats[key]`` stayed within ``rtol`` of its first value for ``patience`` calls.

    Args:
        key: Stats key to watch.
        patience: Consecutive calls the value must stay flat.
        rtol: Relative tolerance against the first value of the current window.
    """

    def __init__(self, key: str, patience: int = 5, rtol: float = 1e-3) -> None:
        if patience < 1:
            raise ValueError(f"Plateaus patience must be >= 1, got {patience}")
        self.key, self.patience, self.rtol = key, patience, rtol
        self._window: deque[float] = deque(maxlen=patience + 1)

    def __call__(self, stats: Mapping[str, float]) -> bool:
        value = stats.get(self.key)
        if value is None or math.isnan(value):
            return False
        self._window.append(float(value))
        if len(self._window) <= self.patience:
            return False
        ref = self._window[0]
        return all(abs(v - ref) <= self.rtol * max(abs(ref), 1e-12) for v in self._window)

    def __repr__(self) -> str:
        return f"Plateaus({self.key!r}, patience={self.patience}, rtol={self.rtol})"
