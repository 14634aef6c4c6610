"""What a tuning study needs to run and resume its trials: `TuneSettings`, saved in the
study directory as ``tune.json``, and reading them back from an untrusted directory."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlloop.errors import RunDirError
from rlloop.system.run_files import STUDY_FILE
from rlloop.tuning.space import Param, parse_space

_SETTINGS = STUDY_FILE


@dataclass
class TuneSettings:
    """What a study needs to run (and resume) its trials; saved as ``tune.json``."""

    algo: str
    env: str
    trials: int
    """Finished (complete or pruned) trials the study runs to."""
    space: dict[str, Any]
    sets: list[str] = field(default_factory=list)
    """``--set`` items applied to every trial, before the sampled values."""
    flags: dict[str, Any] = field(default_factory=dict)
    """Command-line settings of every trial (seed, total_env_steps, ...)."""
    startup_trials: int = 5
    """Trials sampled at random before TPE models the space, and before any pruning."""
    warmup_evals: int = 1
    """Evaluations a trial makes before the pruner may stop it."""
    seed: int = 0
    """The sampler's seed."""

    def params(self) -> list[Param]:
        return parse_space(self.space, "space.yaml")


_FIELD_TYPES: dict[str, type] = {"algo": str, "env": str, "trials": int, "space": dict,
                                 "sets": list, "flags": dict, "startup_trials": int,
                                 "warmup_evals": int, "seed": int}


def load_settings(path: Path) -> TuneSettings:
    """The settings saved in ``path``'s ``tune.json``; ``RunDirError`` (one line) when
    the file is not a study's settings (a study directory is untrusted data)."""
    file = path / _SETTINGS
    try:
        settings = TuneSettings(**json.loads(file.read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError) as e:  # UnicodeDecodeError is a ValueError
        raise RunDirError(f"{file} is not an rlloop study's settings ({' '.join(str(e).split())}"
                          "); pass a directory made by `rlloop tune`") from None
    bad = [name for name, kind in _FIELD_TYPES.items()
           if not isinstance(getattr(settings, name), kind)
           or (kind is int and isinstance(getattr(settings, name), bool))]
    if not all(isinstance(item, str) for item in settings.sets):
        bad.append("sets")
    if bad:
        raise RunDirError(f"{file} is not an rlloop study's settings (bad {', '.join(bad)}); "
                          "pass a directory made by `rlloop tune`")
    return settings
