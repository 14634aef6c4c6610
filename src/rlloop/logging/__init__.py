"""Metrics logging: `MetricsLogger` reduces per-iteration values; sinks record the results.

Importing this package does not import MLflow or TensorBoard; their sinks do, when created.
"""

from __future__ import annotations

from rlloop.logging.console import ConsoleSink, format_number, print_summary
from rlloop.logging.metrics import MetricsLogger, flatten_key, flatten_mapping
from rlloop.logging.mlflow_sink import MlflowSink, sqlite_tracking_uri
from rlloop.logging.process_sink import ProcessSink
from rlloop.logging.sinks import JsonlSink, MultiSink, Sink, ThrottledSink
from rlloop.logging.tensorboard_sink import TensorBoardSink

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
