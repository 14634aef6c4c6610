"""`MetricsLogger`: log values by key every iteration, reduce them once per report.

Each key keeps its own reduction, fixed by the first `log_value` call for that key:

- ``reduce``: ``"mean"``, ``"min"``, ``"max"`` or ``"sum"``.
- ``window=W``: reduce over the last W values only.
- ``ema_coeff=c`` (``"mean"`` only, not with a window): exponential moving average,
  ``ema <- ema + c * (x - ema)``, starting at the first value.
- neither: reduce over every value since the key was last cleared. With the default
  ``clear_on_reduce=False`` that is the lifetime: a lifetime sum, min, max or mean.
- ``clear_on_reduce=True``: forget the values after each `reduce`, so each report covers
  only what was logged since the previous one. An emptied ``"sum"`` reports 0; an emptied
  mean/min/max is left out of the result until it is logged again.
- ``with_throughput=True`` (``"sum"`` only): `reduce` also reports ``<key>_throughput``, the
  amount logged since the previous reduce (or since the key was created) per second.

Keys are strings such as ``"losses/policy"`` or tuples such as ``("default_policy", "loss")``,
flattened with ``"/"``. Values are numbers or one-element tensors; tensors are kept as they are
(detached) until `peek`, `reduce` or `get_state` converts them, all in one go, so logging a
CUDA loss does not force a device sync per call.

The behaviour follows RLlib's learner metrics logger (windows, EMA, lifetime sums, throughput),
except that a mean with neither window nor ``ema_coeff`` is a plain mean, not an implicit EMA.
Not thread-safe: log from one thread.
"""

from __future__ import annotations

import numbers
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, Final, Literal, TypeAlias, get_args

import torch

from rlloop.logging.keys import MetricKey, flatten_key, flatten_mapping

Reduce: TypeAlias = Literal["mean", "min", "max", "sum"]
Value: TypeAlias = float | int | torch.Tensor

STATE_VERSION: Final = 1
_REDUCES: Final = frozenset(get_args(Reduce))
# Pending values are folded into the running state once this many pile up, so a key that is
# logged every env step but rarely reduced keeps bounded memory.
_PENDING_LIMIT: Final = 1024
_MISSING: Final[Any] = object()


def _added(total: float, values: list[float]) -> float:
    """``total + values[0] + values[1] + ...``, in that order."""
    for x in values:
        total += x
    return total


def _to_floats(values: list[Value]) -> list[float]:
    """Convert numbers and 0-d tensors to floats, with one device sync for all tensors."""
    if len(values) == 1:  # most keys, reduced every iteration: no batching to do
        only = values[0]
        return [float(only.item() if isinstance(only, torch.Tensor) else only)]
    out: list[float] = []
    tensor_pos: list[int] = []
    tensors: list[torch.Tensor] = []
    for v in values:
        if isinstance(v, torch.Tensor):
            tensor_pos.append(len(out))
            tensors.append(v)
            out.append(0.0)
        else:
            out.append(float(v))
    if tensors:
        if tensors[0].is_cpu:
            converted = [t.item() for t in tensors]  # no sync to save; item() is cheapest
        else:
            try:
                converted = torch.stack(tensors).tolist()  # one device sync for all
            except RuntimeError:  # tensors on different devices
                converted = [t.item() for t in tensors]
        for pos, x in zip(tensor_pos, converted, strict=True):
            out[pos] = float(x)
    return out


class _Stat:
    """One key's settings and running state. New values wait in `pending` until folded."""

    __slots__ = (
        "acc",
        "clear_on_reduce",
        "count",
        "ema_coeff",
        "pending",
        "reduce",
        "since_reduce",
        "t_last",
        "window_values",
        "with_throughput",
    )

    def __init__(
        self,
        reduce: Reduce,
        window: int | None,
        ema_coeff: float | None,
        clear_on_reduce: bool,
        with_throughput: bool,
        now: float,
    ) -> None:
        self.reduce = reduce
        self.ema_coeff = ema_coeff
        self.clear_on_reduce = clear_on_reduce
        self.with_throughput = with_throughput
        self.pending: list[Value] = []
        self.window_values: deque[float] | None = None if window is None else deque(maxlen=window)
        self.acc: float | None = None  # the EMA, or the running sum/min/max since the last clear
        self.count = 0  # number of values in `acc` (for the plain mean)
        self.since_reduce = 0.0  # sum of values folded since the last reduce (for throughput)
        self.t_last = now  # clock time of the last reduce (or of creation)

    @property
    def window(self) -> int | None:
        return None if self.window_values is None else self.window_values.maxlen

    def fold(self) -> None:
        if not self.pending:
            return
        new = _to_floats(self.pending)
        self.pending = []
        # Sums add value by value onto what was folded before, so a sum never depends on
        # when folds happened (a checkpoint folds): `acc + sum(new)` rounds by the groups.
        if self.with_throughput:
            self.since_reduce = _added(self.since_reduce, new)
        if self.window_values is not None:
            self.window_values.extend(new)  # the deque's maxlen drops the oldest
        elif self.ema_coeff is not None:
            c, ema = self.ema_coeff, self.acc
            for x in new:
                ema = x if ema is None else ema + c * (x - ema)
            self.acc = ema
        elif self.reduce in ("sum", "mean"):
            self.acc = _added(self.acc or 0.0, new)
            self.count += len(new)
        else:
            op = min if self.reduce == "min" else max
            part = op(new)
            self.acc = part if self.acc is None else op(self.acc, part)

    def result(self) -> float | None:
        """The reduced value, or None for an empty mean/min/max."""
        self.fold()
        if self.window_values is not None:
            vals = self.window_values
            if not vals:
                return 0.0 if self.reduce == "sum" else None
            if self.reduce == "mean":
                return sum(vals) / len(vals)
            if self.reduce == "sum":
                return sum(vals)
            return min(vals) if self.reduce == "min" else max(vals)
        if self.acc is None:
            return 0.0 if self.reduce == "sum" else None
        if self.reduce == "mean" and self.ema_coeff is None:
            return self.acc / self.count
        return self.acc

    def clear(self) -> None:
        self.pending = []
        if self.window_values is not None:
            self.window_values.clear()
        self.acc = None
        self.count = 0

    def state(self) -> dict[str, Any]:
        self.fold()
        return {
            "reduce": self.reduce,
            "window": self.window,
            "ema_coeff": self.ema_coeff,
            "clear_on_reduce": self.clear_on_reduce,
            "with_throughput": self.with_throughput,
            "values": None if self.window_values is None else list(self.window_values),
            "acc": self.acc,
            "count": self.count,
            "since_reduce": self.since_reduce,
        }


def _validate(
    name: str,
    reduce: str,
    window: int | None,
    ema_coeff: float | None,
    with_throughput: bool,
) -> None:
    if reduce not in _REDUCES:
        raise ValueError(f"{name}: reduce must be one of {sorted(_REDUCES)}, got {reduce!r}")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int)):
        raise TypeError(f"{name}: window must be a positive int or None, got {window!r}")
    if window is not None and window < 1:
        raise ValueError(f"{name}: window must be >= 1, got {window}")
    if ema_coeff is not None:
        if window is not None:
            raise ValueError(
                f"{name}: pass either window={window} or ema_coeff={ema_coeff}, not both"
            )
        if reduce != "mean":
            raise ValueError(f"{name}: ema_coeff needs reduce='mean', got reduce={reduce!r}")
        if not 0.0 < ema_coeff <= 1.0:
            raise ValueError(f"{name}: ema_coeff must be in (0, 1], got {ema_coeff}")
    if with_throughput and reduce != "sum":
        raise ValueError(
            f"{name}: with_throughput needs reduce='sum' (a count), got reduce={reduce!r}"
        )


class MetricsLogger:
    """Collects per-key values and reduces them to a flat ``{"a/b": float}`` dict.

    Args:
        clock: Seconds as a float, used only for throughput. Inject a fake one in tests.
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._stats: dict[str, _Stat] = {}

    def log_value(
        self,
        key: MetricKey,
        value: Value,
        *,
        reduce: Reduce = "mean",
        window: int | None = None,
        ema_coeff: float | None = None,
        clear_on_reduce: bool = False,
        with_throughput: bool = False,
    ) -> None:
        """Add one value under `key`.

        The settings are taken from the first call for a key; later calls only add values
        (their settings are not re-checked, to keep this call cheap).
        """
        name = key if type(key) is str else flatten_key(key)
        stat = self._stats.get(name)
        if stat is None:
            flatten_key(name)  # rejects the empty string
            _validate(name, reduce, window, ema_coeff, with_throughput)
            stat = _Stat(reduce, window, ema_coeff, clear_on_reduce, with_throughput, self._clock())
            self._stats[name] = stat
        cls = type(value)
        if cls is not float and cls is not int:
            if isinstance(value, torch.Tensor):
                if value.numel() != 1:
                    raise ValueError(f"{name}: expected a one-element tensor, got {value.shape}")
                if value.requires_grad:
                    # Detach so a logged loss does not keep its autograd graph alive until reduce.
                    value = value.detach()
                if value.dim():
                    value = value.reshape(())
            elif isinstance(value, numbers.Real):  # bool, numpy scalars, ...
                value = float(value)
            else:
                raise TypeError(f"{name}: expected a number or tensor, got {cls.__name__}")
        stat.pending.append(value)
        if len(stat.pending) >= _PENDING_LIMIT:
            stat.fold()

    def log_dict(
        self,
        mapping: Mapping[Any, Any],
        *,
        reduce: Reduce = "mean",
        window: int | None = None,
        ema_coeff: float | None = None,
        clear_on_reduce: bool = False,
        with_throughput: bool = False,
    ) -> None:
        """`log_value` for every leaf of a (possibly nested) mapping, with the same settings."""
        for name, value in flatten_mapping(mapping).items():
            self.log_value(
                name,
                value,
                reduce=reduce,
                window=window,
                ema_coeff=ema_coeff,
                clear_on_reduce=clear_on_reduce,
                with_throughput=with_throughput,
            )

    def peek(self, key: MetricKey, default: Any = _MISSING) -> Any:
        """The current reduced value of `key` without clearing anything.

        Returns `default` (or raises KeyError without one) when the key was never logged or
        is a mean/min/max emptied by ``clear_on_reduce``.
        """
        name = flatten_key(key)
        stat = self._stats.get(name)
        value = None if stat is None else stat.result()
        if value is None:
            if default is _MISSING:
                raise KeyError(f"no value logged under {name!r}")
            return default
        return value

    def reduce(self) -> dict[str, float]:
        """Reduce every key to a float; apply ``clear_on_reduce``; report throughputs."""
        now = self._clock()
        out: dict[str, float] = {}
        for name, stat in self._stats.items():
            value = stat.result()
            if value is not None:
                out[name] = value
            if stat.with_throughput:
                elapsed = now - stat.t_last
                if elapsed > 0:  # a key created at this very instant has no rate yet
                    out[name + "_throughput"] = stat.since_reduce / elapsed
                stat.since_reduce = 0.0
                stat.t_last = now
            if stat.clear_on_reduce:
                stat.clear()
        return out

    def delete(self, prefix: MetricKey) -> None:
        """Drop `prefix` and every key under ``prefix + "/"`` (e.g. a removed module's)."""
        name = flatten_key(prefix)
        under = name + "/"
        for key in [k for k in self._stats if k == name or k.startswith(under)]:
            del self._stats[key]

    def reset(self) -> None:
        """Forget every key."""
        self._stats.clear()

    def get_state(self) -> dict[str, Any]:
        """Plain data (JSON-serialisable) holding every key's settings and running values."""
        return {
            "version": STATE_VERSION,
            "stats": {name: stat.state() for name, stat in self._stats.items()},
        }

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Replace all keys with those in `state` (from `get_state`).

        Throughput restarts its clock now: time spent while not running is not counted.
        """
        version = state.get("version")
        if version != STATE_VERSION:
            raise ValueError(
                f"MetricsLogger state version {version!r} is not supported "
                f"(expected {STATE_VERSION}); was it written by a newer rlloop?"
            )
        now = self._clock()
        stats: dict[str, _Stat] = {}
        for name, s in state["stats"].items():
            _validate(name, s["reduce"], s["window"], s["ema_coeff"], s["with_throughput"])
            stat = _Stat(
                s["reduce"],
                s["window"],
                s["ema_coeff"],
                bool(s["clear_on_reduce"]),
                bool(s["with_throughput"]),
                now,
            )
            if stat.window_values is not None:
                stat.window_values.extend(float(v) for v in s["values"])
            stat.acc = None if s["acc"] is None else float(s["acc"])
            stat.count = int(s["count"])
            stat.since_reduce = float(s["since_reduce"])
            stats[name] = stat
        self._stats = stats

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, str | tuple) or not key:
            return False
        return flatten_key(key) in self._stats

    def __len__(self) -> int:
        return len(self._stats)

    def keys(self) -> list[str]:
        """The flat names of every logged key."""
        return list(self._stats)
