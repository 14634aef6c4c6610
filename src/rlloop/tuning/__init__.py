"""Hyperparameter tuning with Optuna (``rlloop tune``).

See `rlloop.tuning.study` (the study and its trials) and `rlloop.tuning.study_dir` (a
study's directory, checked before its first trial).

Optuna is imported only when a study runs (``pip install 'rlloop[tune]'``).

May import: everything up to ``runs`` (each trial is a run); nothing imports it but the CLI.
"""

from __future__ import annotations

from rlloop.tuning.settings import TuneSettings
from rlloop.tuning.space import DEFAULT_SPACES, Param, default_space, load_space, parse_space
from rlloop.tuning.study import OptunaPruning, Study, TuneResult, tune
from rlloop.tuning.study_dir import prepare

__all__ = ["DEFAULT_SPACES", "OptunaPruning", "Param", "Study", "TuneResult", "TuneSettings",
           "default_space", "load_space", "parse_space", "prepare", "tune"]
