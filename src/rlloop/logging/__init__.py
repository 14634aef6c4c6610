"""Metrics logging: `MetricsLogger` reduces per-iteration values; sinks record the results.

Names are imported on first use (PEP 562): the MLflow child process imports its sink from
here without torch, rich, MLflow or TensorBoard coming along with the package.

May import: ``rlloop.errors`` and ``system`` only.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlloop.logging.console import ConsoleSink, format_number, print_summary
    from rlloop.logging.keys import flatten_key, flatten_mapping
    from rlloop.logging.metrics import MetricsLogger
    from rlloop.logging.mlflow_sink import MlflowSink
    from rlloop.logging.mlflow_store import sqlite_tracking_uri
    from rlloop.logging.process_sink import ProcessSink
    from rlloop.logging.sinks import JsonlSink, MultiSink, Sink, ThrottledSink
    from rlloop.logging.tensorboard_sink import TensorBoardSink

_MODULES = {
    "ConsoleSink": "console", "format_number": "console", "print_summary": "console",
    "flatten_key": "keys", "flatten_mapping": "keys", "MetricsLogger": "metrics",
    "MlflowSink": "mlflow_sink", "sqlite_tracking_uri": "mlflow_store",
    "ProcessSink": "process_sink", "JsonlSink": "sinks", "MultiSink": "sinks",
    "Sink": "sinks", "ThrottledSink": "sinks", "TensorBoardSink": "tensorboard_sink",
}


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        return getattr(importlib.import_module(f"{__name__}.{_MODULES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ConsoleSink",
    "JsonlSink",
    "MetricsLogger",
    "MlflowSink",
    "MultiSink",
    "ProcessSink",
    "Sink",
    "TensorBoardSink",
    "ThrottledSink",
    "flatten_key",
    "flatten_mapping",
    "format_number",
    "print_summary",
    "sqlite_tracking_uri",
]
