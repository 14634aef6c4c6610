"""Device settings as names (``auto``, ``cpu``, ``cuda:1``), checked without importing torch.

:mod:`rlloop.system.devices` turns a name into a ``torch.device``; the config and the CLI only
need to know whether a name is well formed, and stay torch-free for it.
"""

from __future__ import annotations

import re

from rlloop.errors import ConfigError

DEVICE_CHOICES = "auto, cpu, cuda, cuda:N or mps"
_DEVICE_RE = re.compile(r"auto|cpu|mps|cuda(:[0-9]+)?")


def check_device_name(name: object) -> str:
    """``name`` if it is a valid device setting, else a ConfigError naming the choices."""
    if not isinstance(name, str) or not _DEVICE_RE.fullmatch(name):
        raise ConfigError(f"device must be one of {DEVICE_CHOICES}, got {name!r}")
    return name
