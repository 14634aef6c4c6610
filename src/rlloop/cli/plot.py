"""``rlloop plot``: overlay the learning curves of several runs in one figure.

Runs whose configs differ only in the seed are seeds of one setting: they are drawn as
one mean curve with a min-max band, interpolated onto a shared x grid. Only
``config.yaml`` (as data) and ``metrics.jsonl`` are read, so nothing a run names is
imported.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rlloop.config.loading import load_yaml
from rlloop.errors import ConfigError
from rlloop.runs.report import curve, new_figure, png_bytes, read_metrics
from rlloop.system.run_files import check_output_file, write_file

#: Settings that do not make two runs different settings (seeds of one setting differ here).
_NOT_A_SETTING = ("seed", "progress", "mlflow", "mlflow_tracking_uri", "tensorboard",
                  "save_video", "device", "backend")


def _group_key(config: dict[str, Any]) -> str:
    return repr(sorted((k, repr(v)) for k, v in config.items() if k not in _NOT_A_SETTING))


def group_runs(run_dirs: Sequence[Path]) -> dict[str, list[Path]]:
    """Runs by setting (label -> run dirs), in the order given."""
    from rlloop.system.run_files import check_run_dir

    groups: dict[str, list[Path]] = {}
    labels: dict[str, str] = {}
    for run in run_dirs:
        config = load_yaml(check_run_dir(run) / "config.yaml")
        key = _group_key(config)
        labels.setdefault(key, f"{config.get('algo')} {config.get('env')} ({run.name})")
        groups.setdefault(labels[key], []).append(run)
    return groups


def mean_and_band(curves: list[list[tuple[float, float]]], points: int = 200
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """x grid, mean, min and max of ``curves`` on the x range they all cover."""
    lo = max(c[0][0] for c in curves)
    hi = min(c[-1][0] for c in curves)
    grid = np.linspace(lo, hi, points) if hi > lo else np.array([lo])
    ys = np.stack([np.interp(grid, *np.asarray(c).T) for c in curves])
    return grid, ys.mean(0), ys.min(0), ys.max(0)


def _no_metric(metric: str, runs: Sequence[Path]) -> ConfigError:
    """The refusal of a metric no run logged: a misspelt one names the closest keys the
    runs do log; a known one was not logged yet."""
    logged = sorted({k for r in runs for row in read_metrics(r / "metrics.jsonl") for k in row
                     if k != "step"})
    if logged and metric not in logged:
        close = difflib.get_close_matches(metric, logged, n=3)
        hint = f"did you mean {', '.join(close)}?" if close else \
            f"they log e.g. {', '.join(logged[:5])}"
        return ConfigError(f"the runs never log {metric!r}; {hint}")
    return ConfigError(f"none of the runs logged {metric!r} yet; train them first or pick "
                       "another --metric, e.g. episode/return_mean")


def point_marker(points: int) -> str:
    """A curve of one point draws no line: it is drawn as a dot."""
    return "o" if points == 1 else ""


def plot_runs(run_dirs: Sequence[str | Path], out: str | Path,
              metric: str = "eval/return_mean", x: str = "env/steps") -> dict[str, int]:
    """Write a PNG of ``metric`` against ``x`` ("env/steps" or "wall") for ``run_dirs``;
    returns the runs drawn per group label."""
    runs = list({Path(r).resolve(): Path(r) for r in run_dirs}.values())  # each run once
    check_output_file(Path(out), runs)
    groups = group_runs(runs)
    fig, (ax,) = new_figure(1, width=8.0, height=4.5)
    drawn: dict[str, int] = {}
    for label, runs in groups.items():
        curves = [c for c in (curve(read_metrics(r / "metrics.jsonl"), metric, x)
                              for r in runs) if c]
        if not curves:
            continue
        grid, mean, low, high = mean_and_band(curves)
        count = f", {len(curves)} runs" if len(curves) > 1 else ""
        (line,) = ax.plot(grid, mean, label=f"{label}{count}", marker=point_marker(len(grid)))
        if len(curves) > 1:
            ax.fill_between(grid, low, high, color=line.get_color(), alpha=0.2)
        drawn[label] = len(curves)
    if not drawn:
        raise _no_metric(metric, [r for group in groups.values() for r in group])
    ax.set_xlabel("env steps" if x == "env/steps" else "wall time (s)")
    ax.set_ylabel(metric)
    ax.grid(alpha=0.3)
    ax.legend(loc="best")
    write_file(Path(out), png_bytes(fig))
    return drawn
