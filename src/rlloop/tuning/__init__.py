"""Hyperparameter tuning with Optuna (``rlloop tune``): see `rlloop.tuning.study`.

Optuna is imported only when a study runs (``pip install 'rlloop[tune]'``).
"""

from __future__ import annotations

from rlloop.tuning.space import DEFAULT_SPACES, Param, default_space, load_space, parse_space
from rlloop.tuning.study import OptunaPruning, Study, TuneResult, TuneSettings, prepare, tune

__all__ = ["DEFAULT_SPACES", "OptunaPruning", "Param", "Study", "TuneResult", "TuneSettings",
           "default_space", "load_space", "parse_space", "prepare", "tune"]
