"""rlloop's typed errors for bad input. Each message names the problem and the fix."""

from __future__ import annotations


class RlloopError(Exception):
    """Base of every error rlloop raises on purpose."""


class ConfigError(RlloopError, ValueError):
    """A config value, key or combination that cannot work."""


class RunDirError(RlloopError, ValueError):
    """A path that is not an rlloop run directory (or cannot become one)."""


class DiskFullError(RlloopError, OSError):
    """The device of the run directory is full; the run can resume once there is room."""
