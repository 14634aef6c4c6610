"""Settings that act only beside another one (gSDE's knobs need ``use_sde``, OU noise's
need ``action_noise: ornstein_uhlenbeck``, ...): set while that switch is off, they change
nothing. They are accepted (a tuning space may sample one across the switch) and named in
one warning each at the start of a run.

A config dataclass declares its dependencies as ``UNUSED_WHEN``: tuples of (switch field,
the switch values that leave the settings unused, the settings).
"""

from __future__ import annotations

import dataclasses
from typing import Any

#: (switch, values under which the settings do nothing, settings)
Dependency = tuple[str, tuple[Any, ...], tuple[str, ...]]


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def unused_settings(config: Any) -> list[str]:
    """One line per setting of ``config`` changed from its default that its switch leaves
    unused, naming both and the fix."""
    rules: tuple[Dependency, ...] = getattr(config, "UNUSED_WHEN", ())
    defaults = {f.name: _default(f) for f in dataclasses.fields(config)}
    section = getattr(config, "section", "")
    lines = []
    for switch, idle, names in rules:
        value = getattr(config, switch)
        if value not in idle:
            continue
        for name in names:
            if getattr(config, name) != defaults[name]:
                lines.append(f"{section}.{name}={getattr(config, name)!r} has no effect while "
                             f"{section}.{switch} is {value!r}; drop it or change "
                             f"{section}.{switch}")
    return lines
