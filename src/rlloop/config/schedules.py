"""Scalar schedules on the env-step timeline (learning rates, entropy coefficients, ...).

A schedule is plain data (a frozen dataclass), so a checkpoint stores it in its
manifest and a config spells it in YAML: ``{"type": "linear", "start": 1e-3, "end": 0.0,
"steps": 100000}``, or just a number for a constant.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass, fields
from typing import Any, Protocol


class ScheduleError(ValueError):
    """A schedule spec that cannot be built."""


class Schedule(Protocol):
    def __call__(self, env_steps: int) -> float: ...


def _check(kind: str, steps: int | None = None, **values: float) -> None:
    """ScheduleError for a non-finite value or a non-positive step count."""
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(
                value):
            raise ScheduleError(f"{kind} schedule {name} must be a finite number, got {value!r}")
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int)
                              or steps <= 0):
        raise ScheduleError(f"{kind} schedule steps must be an integer > 0, got {steps!r}")


@dataclass(frozen=True)
class Constant:
    value: float

    def __post_init__(self) -> None:
        _check("constant", value=self.value)

    def __call__(self, env_steps: int) -> float:
        return self.value


@dataclass(frozen=True)
class Linear:
    """From ``start`` at step 0 to ``end`` at ``steps``, constant afterwards."""

    start: float
    end: float
    steps: int

    def __post_init__(self) -> None:
        _check("linear", self.steps, start=self.start, end=self.end)

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
        for x, y in self.points:
            _check("piecewise", point_step=x, point_value=y)

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

    def __post_init__(self) -> None:
        _check("cosine", self.steps, start=self.start, end=self.end)

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

    def __post_init__(self) -> None:
        _check("exponential", self.steps, start=self.start, decay=self.decay, end=self.end)

    def __call__(self, env_steps: int) -> float:
        return max(self.start * self.decay ** (env_steps / max(self.steps, 1)), self.end)


_KINDS: dict[str, type] = {
    "constant": Constant, "linear": Linear, "piecewise": PiecewiseLinear,
    "cosine": Cosine, "exponential": Exponential,
}


def learning_rate(lr: float, schedule: str, decay_steps: int) -> Schedule:
    """A config's ``lr`` under its ``lr_schedule``: ``"constant"``, or ``"linear"`` from
    ``lr`` to 0 over ``decay_steps`` env steps (rl-zoo's ``lin_`` values)."""
    return Linear(float(lr), 0.0, int(decay_steps)) if schedule == "linear" else Constant(
        float(lr))


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
        try:
            if kind == "piecewise":
                args["points"] = tuple((_to_int(x), _to_float(y))
                                       for x, y in args.get("points", ()))
            else:
                types = {f.name: f.type for f in fields(_KINDS[kind])}
                args = {k: _to_int(v) if types.get(k) == "int" else _to_float(v)
                        for k, v in args.items()}
            return _KINDS[kind](**args)  # type: ignore[no-any-return]
        except (TypeError, ValueError) as e:
            if isinstance(e, ScheduleError):
                raise
            raise ScheduleError(f"bad arguments for a {kind} schedule: {e}") from None
    if callable(spec):
        return spec
    raise ScheduleError(f"schedule must be a number or a dict, got {spec!r}")


def _to_float(value: Any) -> Any:
    """Numbers as a Python user writes them: YAML reads ``4e-3`` as a string."""
    if isinstance(value, str):
        return float(value)
    return value


def _to_int(value: Any) -> Any:
    """An integer, also from ``1e5`` (a float or a string) when it is whole."""
    value = _to_float(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def schedule_spec(schedule: Schedule) -> dict[str, Any]:
    """The data form of a built-in schedule (inverse of :func:`make_schedule`)."""
    for name, cls in _KINDS.items():
        if type(schedule) is cls:
            data = asdict(schedule)  # type: ignore[call-overload]
            if name == "piecewise":
                data["points"] = [list(p) for p in data["points"]]
            return {"type": name, **data}
    raise ScheduleError(f"{schedule!r} is not a built-in schedule and cannot be saved as data")
