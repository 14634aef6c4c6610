"""TensorBoard sink: one scalar series per metric key, params as text and hparams.

View with ``tensorboard --logdir <log_dir>``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rlloop.logging.keys import flatten_mapping


def _markdown_table(flat: Mapping[str, Any]) -> str:
    rows = "\n".join(f"| {k} | {str(v).replace('|', '/')} |" for k, v in sorted(flat.items()))
    return "| param | value |\n|---|---|\n" + rows


class TensorBoardSink:
    """Write event files under `log_dir` with `torch.utils.tensorboard.SummaryWriter`.

    The writer queues events and writes them from a background thread, so `log_metrics`
    does no file I/O itself; files are flushed every `flush_secs` and on `close`.
    """

    def __init__(self, log_dir: str | Path, *, flush_secs: int = 10) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:  # torch raises this when `tensorboard` is missing
            raise ImportError(
                "TensorBoardSink needs the tensorboard package: pip install 'rlloop[tensorboard]'"
            ) from exc
        self.log_dir = Path(log_dir)
        self._writer = SummaryWriter(log_dir=str(self.log_dir), flush_secs=flush_secs)
        self._closed = False

    def log_params(self, params: Mapping[str, Any]) -> None:
        flat = flatten_mapping(params)
        self._writer.add_text("params", _markdown_table(flat))
        hparams = {
            k: v if isinstance(v, bool | int | float | str) else str(v) for k, v in flat.items()
        }
        # run_name="." keeps the hparams in this run's folder instead of a timestamped subfolder.
        self._writer.add_hparams(hparams, {}, run_name=".")

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        add = self._writer.add_scalar
        for name, value in metrics.items():
            add(name, float(value), global_step=int(step))

    def close(self, status: str = "FINISHED") -> None:
        if self._closed:
            return
        self._closed = True
        self._writer.add_text("status", status)
        self._writer.close()
