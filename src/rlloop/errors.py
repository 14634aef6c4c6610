"""rlloop's typed errors for bad input. Each message names the problem and the fix."""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Mapping


class RlloopError(Exception):
    """Base of every error rlloop raises on purpose."""


class ConfigError(RlloopError, ValueError):
    """A config value, key or combination that cannot work."""


class RunDirError(RlloopError, ValueError):
    """A path that is not an rlloop run directory (or cannot become one)."""


class DiskFullError(RlloopError, OSError):
    """The device of the run directory is full (or a file reached its size limit); the run
    can resume once there is room."""


# The two below are defined here, torch-free, so the CLI can catch them without importing
# the env and checkpoint packages (and torch); those packages re-export them.
class EnvError(ValueError):
    """Bad environment input: unknown id, unsupported space, bad backend."""


class CheckpointError(Exception):
    """Base class; the message names the file, the problem and the fix."""


class SavedStateError(ValueError):
    """A saved value (a checkpoint's) that the built run cannot take: wrong type, out of
    range, a shape unlike the built module's, NaN or infinite weights. Whoever loaded it
    names the checkpoint (``rlloop.checkpoint.restoring`` makes it a damaged one)."""


#: The largest counter a checkpoint may hold (exclusive): 2**53 env steps would take
#: centuries, and every integer below it is exact as a float (metrics, MLflow's steps).
MAX_SAVED_COUNT = 2**53


def saved_count(value: object, name: str) -> int:
    """``value`` as a counter: an int in [0, MAX_SAVED_COUNT), else SavedStateError."""
    if type(value) is not int or not 0 <= value < MAX_SAVED_COUNT:
        raise SavedStateError(f"{name} is {value!r:.40}, not a count (an integer from 0 "
                              f"to 2**53)")
    return value


def check_finite(section: str, config: object) -> None:
    """ConfigError for the first NaN or infinite float field of a config dataclass.

    ``x <= 0`` is False for NaN, so range checks alone let ``lr=.nan`` through (every update
    then becomes non-finite and is skipped); this runs before them.
    """
    prefix = f"{section}." if section else ""
    for f in dataclasses.fields(config):  # type: ignore[arg-type]
        value = getattr(config, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{prefix}{f.name} must be a finite number, got {value}")


def check_finite_values(name: str, value: object) -> None:
    """ConfigError for the first NaN or infinite number anywhere in ``value``, a setting of
    free shape (``env_kwargs``): mappings and lists are searched, and the error names the
    entry (``env_kwargs.opts.scale[1]``)."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            check_finite_values(f"{name}.{key}", item)
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            check_finite_values(f"{name}[{i}]", item)
    # (NumPy floats are Reals too; integers are finite, and may overflow math.isfinite)
    elif (isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral)
          and not math.isfinite(value)):
        raise ConfigError(f"{name} must be a finite number, got {value}")


#: The largest |init_log_std|: a standard deviation from 2e-9 to 5e8 (float32's exp
#: overflows past 88, and a policy at either end never learns).
MAX_ABS_LOG_STD = 20.0


def check_init_log_std(name: str, value: float) -> None:
    """ConfigError for an initial log standard deviation outside +-MAX_ABS_LOG_STD."""
    if abs(value) > MAX_ABS_LOG_STD:
        raise ConfigError(f"{name} must be in [-{MAX_ABS_LOG_STD:g}, {MAX_ABS_LOG_STD:g}] (the "
                          f"standard deviation is exp(value): beyond that it overflows or "
                          f"vanishes in float32), got {value}")


def suggest_lower(key: str, fits: int) -> str:
    """``"e.g. --set KEY=N (at most FITS fit)"``, N about half of what fits: the rest of
    the run needs memory too."""
    half = max(fits // 2, 1)
    suggestion = int(str(half)[0]) * 10 ** (len(str(half)) - 1)
    return f"e.g. --set {key}={suggestion} (at most {fits:,} fit)"
