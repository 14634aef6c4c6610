"""The end-of-run report: summary.json, report.md and a learning-curve SVG.

The SVG is drawn by hand so the report needs no plotting library.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlloop.runfiles import write_file

if TYPE_CHECKING:
    from rlloop.config import RunConfig
    from rlloop.run import RunResult

CURVES = (("episode/return_mean", "train return", "#1f77b4"),
          ("eval/return_mean", "eval return", "#d62728"))


def read_metrics(path: Path) -> list[dict[str, Any]]:
    rows = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue  # a line cut by a crash
    return rows


def curve(rows: list[dict[str, Any]], key: str) -> list[tuple[float, float]]:
    return [(float(r.get("env/steps", r.get("step", 0))), float(r[key])) for r in rows
            if isinstance(r.get(key), int | float) and math.isfinite(r[key])]


def learning_curve_svg(rows: list[dict[str, Any]], width: int = 640, height: int = 360) -> str:
    series = [(curve(rows, key), label, color) for key, label, color in CURVES]
    points = [p for s, _, _ in series for p in s]
    pad = 50
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'font-family="sans-serif" font-size="12"><rect width="100%" height="100%" '
             f'fill="white"/>']
    if points:
        x0, x1 = min(p[0] for p in points), max(p[0] for p in points)
        y0, y1 = min(p[1] for p in points), max(p[1] for p in points)
        x1, y1 = (x1 if x1 > x0 else x0 + 1), (y1 if y1 > y0 else y0 + 1)

        def sx(x: float) -> float:
            return pad + (x - x0) / (x1 - x0) * (width - 2 * pad)

        def sy(y: float) -> float:
            return height - pad - (y - y0) / (y1 - y0) * (height - 2 * pad)

        parts.append(f'<line x1="{pad}" y1="{height - pad}" x2="{width - pad}" '
                     f'y2="{height - pad}" stroke="black"/><line x1="{pad}" y1="{pad}" '
                     f'x2="{pad}" y2="{height - pad}" stroke="black"/>')
        parts.append(f'<text x="{pad}" y="{height - pad + 18}">{x0:,.0f}</text>'
                     f'<text x="{width - pad}" y="{height - pad + 18}" text-anchor="end">'
                     f'{x1:,.0f} env steps</text><text x="{pad - 4}" y="{sy(y1) + 4}" '
                     f'text-anchor="end">{y1:.0f}</text><text x="{pad - 4}" y="{sy(y0)}" '
                     f'text-anchor="end">{y0:.0f}</text>')
        for i, (pts, label, color) in enumerate(series):
            if pts:
                path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts)
                parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" '
                             f'points="{path}"/>')
            parts.append(f'<text x="{width - pad}" y="{pad + 16 * i}" text-anchor="end" '
                         f'fill="{color}">{label}</text>')
    parts.append("</svg>")
    return "".join(parts)


def write_report(run_dir: Path, result: RunResult, config: RunConfig) -> None:
    """Write summary.json, learning_curve.svg and report.md into ``run_dir``."""
    rows = read_metrics(run_dir / "metrics.jsonl")
    last = result.last_stats
    summary = {
        "algo": config.algo, "env": config.env, "seed": config.seed,
        "env_steps": result.env_steps, "wall_time_s": result.wall_time_s,
        "best_eval_return": result.best_eval_return,
        "last_eval_return": last.get("eval/return_mean"),
        "stopped_by": result.stopped_by,
        "env_steps_per_s": result.env_steps / max(last.get("time/total_s", 0.0), 1e-9)
        if last.get("time/total_s") else None,
    }
    write_file(run_dir / "summary.json", json.dumps(summary, indent=2))
    write_file(run_dir / "learning_curve.svg", learning_curve_svg(rows))
    lines = [f"# {config.algo} on {config.env}", "", "| | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in summary.items()]
    lines += ["", "![learning curve](learning_curve.svg)", ""]
    write_file(run_dir / "report.md", "\n".join(lines))
