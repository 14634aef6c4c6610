"""Scalar schedules on the env-step timeline (learning rates, entropy coefficients, ...).

A schedule is plain data (a frozen dataclass), so a checkpoint stores it in its
manifest and a config spells it in YAML: ``{"type": "linear", "start": 1e-3, "end": 0.0,
"steps": 100000}``, or just a number for a constant.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass
from typing import Any, Protocol


class ScheduleError(ValueError):
    """A schedule spec that cannot be built."""


class Schedule(Protocol):
    def __call__(self, env_steps: int) -> float: ...


@dataclass(frozen=True)
class Constant:
    value: float

    def __call__(self, env_steps: int) -> float:
        return self.value


@dataclass(frozen=True)
class Linear:
    """From ``start`` at step 0 to ``end`` at ``steps``, constant afterwards."""

    start: float
    end: float
    steps: int

    def __call__(self, env_steps: int) -> float:
        frac = min(max(env_steps / max(self.steps, 1), 0.0), 1.0)
        return self.start + frac * (self.end - self.start)


@dataclass(frozen=True)
class PiecewiseLinear:
    """Linear between ``(env_step, value)`` points, constant outside them."""

    points: tuple[tuple[int, float], ...]

    def __post_init__(self) -> None:
        xs = [p[0] for p in self.points]
        if not self.points or xs != sorted(xs):
            raise ScheduleError("piecewise schedule needs points sorted by env step, e.g. "
                                "[[0, 1e-3], [50000, 1e-4]]")

    def __call__(self, env_steps: int) -> float:
        pts = self.points
        if env_steps <= pts[0][0]:
            return pts[0][1]
        for (x0, y0), (x1, y1) in itertools.pairwise(pts):
            if env_steps <= x1:
                return y0 + (env_steps - x0) / max(x1 - x0, 1) * (y1 - y0)
        return pts[-1][1]


@dataclass(frozen=True)
class Cosine:
    """Cosine decay from ``start`` to ``end`` over ``steps`` (Loshchilov & Hutter, 2017)."""

    start: float
    end: float
    steps: int

    def __call__(self, env_steps: int) -> float:
        frac = min(max(env_steps / max(self.steps, 1), 0.0), 1.0)
        return self.end + 0.5 * (self.start - self.end) * (1 + math.cos(math.pi * frac))


@dataclass(frozen=True)
class Exponential:
    """``start * decay ** (env_steps / steps)``, floored at ``end``."""

    start: float
    decay: float
    steps: int
    end: float = 0.0

    def __call__(self, env_steps: int) -> float:
        return max(self.start * self.decay ** (env_steps / max(self.steps, 1)), self.end)


_KINDS: dict[str, type] = {
    "constant": Constant, "linear": Linear, "piecewise": PiecewiseLinear,
    "cosine": Cosine, "exponential": Exponential,
}


def make_schedule(spec: float | int | dict[str, Any] | Schedule) -> Schedule:
    """Build a schedule from a number, a ``{"type": ..., ...}`` dict or a schedule."""
    if isinstance(spec, bool):
        raise ScheduleError(f"schedule must be a number or a dict, got {spec!r}")
    if isinstance(spec, int | float):
        return Constant(float(spec))
    if isinstance(spec, dict):
        args = dict(spec)
        kind = args.pop("type", None)
        if kind not in _KINDS:
            raise ScheduleError(f"unknown schedule type {kind!r}; use one of {sorted(_KINDS)}")
        if kind == "piecewise":
            args["points"] = tuple((int(x), float(y)) for x, y in args.get("points", ()))
        try:
            return _KINDS[kind](**args)  # type: ignore[no-any-return]
        except TypeError as e:
            raise ScheduleError(f"bad arguments for a {kind} schedule: {e}") from None
    if callable(spec):
        return spec
    raise ScheduleError(f"schedule must be a number or a dict, got {spec!r}")


def schedule_spec(schedule: Schedule) -> dict[str, Any]:
    """The data form of a built-in schedule (inverse of :func:`make_schedule`)."""
    for name, cls in _KINDS.items():
        if type(schedule) is cls:
            data = asdict(schedule)  # type: ignore[call-overload]
            if name == "piecewise":
                data["points"] = [list(p) for p in data["points"]]
            return {"type": name, **data}
    raise ScheduleError(f"{schedule!r} is not a built-in schedule and cannot be saved as data")
