"""The end-of-run report: summary.json, report.md, report.html and matplotlib figures.

Figures are drawn on matplotlib's ``Figure`` with the Agg canvas (never pyplot), so no
display or GUI backend is touched, and matplotlib is imported only when a figure is drawn
(``rlloop --help`` stays fast). Every file goes through :func:`rlloop.system.run_files.write_file`.
"""

from __future__ import annotations

import html
import io
import json
import math
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlloop.system.run_files import write_file

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from rlloop.config.run_config import RunConfig
    from rlloop.trainers.result import RunResult

Row = dict[str, Any]
#: Diagnostics worth a panel: PPO's trust-region statistics, Q values, SAC's temperature.
DIAGNOSTICS = ("ppo/approx_kl", "ppo/clip_fraction", "q/mean", "q/target_mean", "alpha/value",
               "policy/entropy", "dqn/epsilon")
#: Training phase timers (seconds per logging interval) that steps/s per phase comes from.
PHASES = ("env", "inference", "learn")
#: Whole-run phase totals (``rlloop.runs.timing``), logged once at the end of a run.
RUN_PHASES = ("startup", "evals", "checkpoints", "logging", "video", "report", "run")


def read_metrics(path: Path) -> list[Row]:
    rows = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue  # a line cut by a crash
    return rows


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def _steps(row: Row) -> float:
    steps: Any = row.get("env/steps", row.get("step"))
    return float(steps) if _finite(steps) else 0.0


def curve(rows: list[Row], key: str, x: str = "env/steps") -> list[tuple[float, float]]:
    """``(x, row[key])`` for the rows that log ``key``; ``x`` is env steps or ``"wall"``:
    the latest ``time/total_s`` seen (eval rows carry none of their own)."""
    points, wall = [], 0.0
    for r in rows:
        wall = float(r["time/total_s"]) if _finite(r.get("time/total_s")) else wall
        if _finite(r.get(key)):
            points.append((wall if x == "wall" else _steps(r), float(r[key])))
    return points


def round_number(value: Any) -> Any:
    """Four significant digits (integers as they are), for tables a person reads."""
    if isinstance(value, bool) or not isinstance(value, float) or not math.isfinite(value):
        return value
    return float(f"{value:.4g}")


# ---- figures ----------------------------------------------------------------------------
def new_figure(panels: int, width: float = 6.0, height: float = 3.4) -> tuple[Figure, list[Axes]]:
    from matplotlib.figure import Figure

    cols = min(panels, 2)
    rows = math.ceil(panels / cols)
    # Fixed margins, not layout="constrained": that measures every label's extent on each
    # draw and was 40% of the report's drawing time (the end of every run waits for it).
    fig = Figure(figsize=(width * cols, height * rows))
    fig.subplots_adjust(left=0.08 if cols == 2 else 0.14, right=0.98, bottom=0.16 / rows,
                        top=1 - 0.1 / rows, wspace=0.25, hspace=0.5)
    axes = fig.subplots(rows, cols, squeeze=False).ravel().tolist()
    for ax in axes[panels:]:
        ax.set_visible(False)
    return fig, axes[:panels]


def png_bytes(fig: Figure) -> bytes:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)  # Agg whatever backend matplotlib would pick for pyplot
    buf = io.BytesIO()
    # zlib level 1: a third of the drawing time of the end of a run went to level 6's
    # compression, for PNGs ~1.7x smaller (tens of kB either way).
    fig.savefig(buf, format="png", dpi=100, pil_kwargs={"compress_level": 1})
    return buf.getvalue()


def _returns_panel(ax: Axes, rows: list[Row], x: str) -> None:
    train = curve(rows, "episode/return_mean", x)
    if train:
        ax.plot(*zip(*train, strict=True), ".-", label="train return", color="tab:blue")
    else:  # ma_ppo with several modules: each agent's (episode/<agent>/return_mean)
        for key in sorted({k for row in rows for k in row if k.startswith("episode/")
                           and k.endswith("/return_mean")})[:MAX_PANELS]:
            ax.plot(*zip(*curve(rows, key, x), strict=True), ".-",
                    label=f"train return, {key.split('/')[1]}")
    mean = curve(rows, "eval/return_mean", x)
    if mean:
        xs, ys = zip(*mean, strict=True)
        std = dict(curve(rows, "eval/return_std", x))
        spread = [std.get(xv, 0.0) for xv in xs]
        # Error bars show the spread of a lone eval too, where a band has no width.
        ax.errorbar(xs, ys, yerr=spread, fmt="o-", capsize=3, color="tab:red",
                    label="eval return ± std")
        ax.fill_between(xs, [y - s for y, s in zip(ys, spread, strict=True)],
                        [y + s for y, s in zip(ys, spread, strict=True)], color="tab:red",
                        alpha=0.15)
    ax.set_xlabel("env steps" if x == "env/steps" else "wall time (s)")
    ax.set_ylabel("episode return")
    ax.grid(alpha=0.3)
    ax.legend(loc="best")


def learning_curves(rows: list[Row]) -> bytes:
    fig, (by_steps, by_time) = new_figure(2)
    _returns_panel(by_steps, rows, "env/steps")
    _returns_panel(by_time, rows, "wall")
    return png_bytes(fig)


def _series_figure(rows: list[Row], keys: Sequence[str]) -> bytes | None:
    """One panel per key (scales differ too much to share an axis); None when no key is
    logged."""
    keys = [k for k in keys if curve(rows, k)]
    if not keys:
        return None
    fig, axes = new_figure(len(keys), height=2.8)
    for ax, key in zip(axes, keys, strict=True):
        ax.plot(*zip(*curve(rows, key), strict=True), ".-", color="tab:purple")
        ax.set_title(key)
        ax.set_xlabel("env steps")
        ax.grid(alpha=0.3)
    return png_bytes(fig)


def phase_rates(rows: list[Row]) -> dict[str, float]:
    """Env steps per second of each phase's own time (env stepping, inference, learning,
    evaluation): total env steps over the summed seconds of that phase."""
    steps = max((_steps(r) for r in rows if _finite(r.get("env/steps"))), default=0.0)
    rates = {}
    for phase in PHASES:
        seconds = sum(float(r[f"time/{phase}_s"]) for r in rows
                      if _finite(r.get(f"time/{phase}_s")))
        if seconds > 0 and steps > 0:
            rates[phase] = steps / seconds
    return rates


#: The phase table is the last sitting's (``rlloop train`` or ``--resume`` invocation):
#: its clock starts with the process.
_PHASES_TITLE = "Seconds per phase of the last sitting (this invocation)"
_NO_CHANGES = ("None: every setting is the algorithm's default or the env's preset "
               "(`rlloop presets ALGO --env ID` lists the preset).")
_NO_PHASES = "Not recorded: a signal stopped this sitting before its last row was written."


def run_phase_times(rows: list[Row]) -> dict[str, float]:
    """Seconds of each whole-run phase (start-up, evaluations, ...): its last logged total."""
    times = {}
    for row in rows:
        for phase in RUN_PHASES:
            if _finite(row.get(f"time/{phase}_s")):
                times[phase] = float(row[f"time/{phase}_s"])
    return times


def throughput(rows: list[Row]) -> bytes | None:
    fig = throughput_figure(rows)
    return None if fig is None else png_bytes(fig)


def throughput_figure(rows: list[Row]) -> Figure | None:
    """Steps/s per phase as bars, and the run's steps/s over its steps; None when neither
    is logged."""
    rates = phase_rates(rows)
    overall = next((k for k in ("env/steps_per_s", "env/fps") if curve(rows, k)), None)
    if not rates and overall is None:
        return None
    fig, (bars, line) = new_figure(2, height=3.0)
    bars.bar(list(rates), list(rates.values()), color="tab:green")
    # Linear from zero: bar lengths compare the rates (on a log axis that starts above
    # zero, a phase 4.5x slower looked 25x slower).
    bars.set_ylim(bottom=0)
    bars.set_ylabel("env steps / s of the phase's time")
    bars.set_title("steps/s per phase")
    if overall is not None:
        line.plot(*zip(*curve(rows, overall), strict=True), ".-", color="tab:green")
        line.set_title(overall)
        line.set_xlabel("env steps")
    line.grid(alpha=0.3)
    return fig


#: Most panels a figure of per-key series draws (ma_ppo's modules multiply the keys).
MAX_PANELS = 12


def _module_keys(rows: list[Row], names: Sequence[str], prefix: bool = False) -> list[str]:
    """The logged keys that are ``names`` (``prefix``: start with one), also as a module's
    (``<module>/losses/policy``: ma_ppo with several modules logs one set per module), in
    order, at most :data:`MAX_PANELS`."""
    logged = sorted({k for row in rows for k in row})

    def matches(key: str) -> bool:
        tails = (key, key.partition("/")[2])
        return any(t.startswith(n) if prefix else t == n for t in tails for n in names)

    return [k for k in logged if matches(k)][:MAX_PANELS]


def report_figures(rows: list[Row]) -> dict[str, bytes]:
    """The report's PNG figures by file name (a figure with nothing to show is left out)."""
    drawers: dict[str, Callable[[list[Row]], bytes | None]] = {
        "learning_curves.png": learning_curves,
        "losses.png": lambda r: _series_figure(r, _module_keys(r, ("losses/",), prefix=True)),
        "diagnostics.png": lambda r: _series_figure(r, _module_keys(r, DIAGNOSTICS)),
        "throughput.png": throughput,
    }
    figures = {name: draw(rows) for name, draw in drawers.items()}
    return {name: png for name, png in figures.items() if png}


# ---- hyperparameters ---------------------------------------------------------------------
def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict) and value:
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def changed_settings(config: RunConfig) -> dict[str, tuple[Any, Any]]:
    """``key: (default, value)`` for each setting that differs from the defaults of the
    run's algorithm and env (the preset included), i.e. what the user chose."""
    from rlloop.config.loading import build_config
    from rlloop.errors import ConfigError

    try:
        defaults = _flatten(build_config(config.algo, config.env).to_dict())
    except ConfigError:
        defaults = {}
    ours = _flatten(config.to_dict())
    return {k: (defaults.get(k), v) for k, v in ours.items() if defaults.get(k) != v}


def _preset_words(config: RunConfig) -> tuple[str, str]:
    """The heading's note and the defaults column's name: a run with a preset compares
    with the preset's values, not rlloop's bare defaults."""
    from rlloop.config.presets import preset

    try:
        has_preset = bool(preset(config.algo, config.env))
    except Exception:  # an env or algorithm the presets cannot read: no preset
        has_preset = False
    if not has_preset:
        return "", "default"
    return f" (the {config.algo} preset for {config.env} included)", "preset / default"


# ---- the report ----------------------------------------------------------------------------
def _table(rows: Iterable[Sequence[Any]], header: Sequence[str]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(str(round_number(c)) for c in row) + " |" for row in rows]


def _html(title: str, summary: dict[str, Any], changed: dict[str, tuple[Any, Any]],
          rates: dict[str, float], times: dict[str, float], figures: Iterable[str],
          preset_note: str = "") -> str:
    def table(rows: Iterable[Sequence[Any]]) -> str:
        body = "".join("<tr>" + "".join(f"<td>{html.escape(str(round_number(c)))}</td>"
                                        for c in row) + "</tr>" for row in rows)
        return f"<table border='1' cellpadding='4'>{body}</table>"

    parts = [f"<!doctype html><meta charset='utf-8'><title>{html.escape(title)}</title>",
             f"<h1>{html.escape(title)}</h1>", table(summary.items()),
             f"<h2>Settings that differ from the defaults{html.escape(preset_note)}</h2>",
             table((k, d, v) for k, (d, v) in changed.items()) if changed
             else f"<p>{_NO_CHANGES}</p>",
             "<h2>Env steps per second, by phase</h2>", table(rates.items()),
             f"<h2>{_PHASES_TITLE}</h2>",
             table(times.items()) if times else f"<p>{_NO_PHASES}</p>"]
    parts += [f"<p><img src='{name}' alt='{name}'></p>" for name in figures]
    return "\n".join(parts) + "\n"


def write_figures(run_dir: Path, rows: list[Row]) -> list[str]:
    """Draw the report's figures into ``run_dir``; their file names."""
    figures = report_figures(rows)
    for name, png in figures.items():
        write_file(run_dir / name, png)
    return list(figures)


#: What a `FigureWriter` child imports while the run trains (matplotlib: ~1 s of CPU).
FIGURE_PRELOAD = ("matplotlib.figure", "matplotlib.backends.backend_agg")


class FigureWriter:
    """The report's figures drawn in a `ProcessSink` child, so matplotlib's import and
    drawing (~2 s of CPU) leave the training process and overlap the end-of-run video.

    It takes no rows: on a ``FINISHED`` close it draws from ``<run>/metrics.jsonl`` (the
    JSONL sink writes whole lines) as `write_figures` would, and reports the names drawn
    as ``result["figures"]``; any other status draws nothing.
    """

    def __init__(self, run_dir: str) -> None:
        self.run_dir = Path(run_dir)
        self.result: dict[str, Any] = {}
        # Built while the run trains: a first figure loads fonts and caches (~0.5 s) that
        # the end of the run would otherwise wait for.
        png_bytes(new_figure(1)[0])

    def log_params(self, params: dict[str, Any]) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        pass

    def close(self, status: str = "FINISHED") -> None:
        if status == "FINISHED":
            rows = read_metrics(self.run_dir / "metrics.jsonl")
            self.result["figures"] = write_figures(self.run_dir, rows)


def _env_steps_per_s(result: RunResult, rows: Sequence[Row]) -> float | None:
    """Training env steps per second of training time, over every sitting of the run (a
    resumed run's clock, ``time/total_s``, starts again at 0, while its steps go on: the
    last row alone paired the whole run's steps with the last sitting's seconds); None
    when nothing was timed."""
    steps = seconds = 0.0
    start = previous = None  # steps where the current sitting began; its last timed row
    for row in rows:
        if not (_finite(row.get("time/total_s")) and row["time/total_s"] > 0):
            continue
        if previous is not None and row["time/total_s"] < previous["time/total_s"]:
            steps += _steps(previous) - (start or 0.0)  # the sitting before ended there
            seconds += float(previous["time/total_s"])
            start = _steps(previous)
        previous = row
    if previous is None:
        total = result.last_stats.get("time/total_s")
        return result.env_steps / float(total) if _finite(total) and total else None
    steps += _steps(previous) - (start or 0.0)
    seconds += float(previous["time/total_s"])
    return steps / seconds


def write_report(run_dir: Path, result: RunResult, config: RunConfig,
                 figures: Sequence[str] | None = None, phases_logged: bool = True) -> None:
    """Write summary.json, the figures, report.md and report.html into ``run_dir``
    (``figures``: names of figures `write_figures` drew already, instead of drawing them;
    ``phases_logged=False``: this sitting wrote no phase row, so the last one in
    ``metrics.jsonl`` is an earlier sitting's and is not shown as this one's)."""
    rows = read_metrics(run_dir / "metrics.jsonl")
    last = result.last_stats
    summary = {
        "algo": config.algo, "env": config.env, "seed": config.seed,
        "env_steps": result.env_steps, "wall_time_s": result.wall_time_s,
        "best_eval_return": result.best_eval_return,
        "last_eval_return": last.get("eval/return_mean"),
        "last_eval_return_std": last.get("eval/return_std"),
        "stopped_by": result.stopped_by,
        "env_steps_per_s": _env_steps_per_s(result, rows),
    }
    write_file(run_dir / "summary.json", json.dumps(summary, indent=2))
    if figures is None:
        figures = write_figures(run_dir, rows)
    changed = changed_settings(config)
    rates = phase_rates(rows)
    title = f"{config.algo} on {config.env}"
    preset_note, default = _preset_words(config)
    lines = [f"# {title}", "", *_table(summary.items(), ("", "")), "",
             f"## Settings that differ from the defaults{preset_note}", ""]
    lines += (_table(((k, d, v) for k, (d, v) in changed.items()),
                     ("setting", default, "this run")) if changed else [_NO_CHANGES])
    lines += ["", "## Env steps per second, by phase", ""]
    lines += _table(rates.items(), ("phase", "env steps/s"))
    times = run_phase_times(rows) if phases_logged else {}
    lines += ["", f"## {_PHASES_TITLE}", ""]
    lines += _table(times.items(), ("phase", "seconds")) if times else [_NO_PHASES]
    lines += ["", *(f"![{name[:-4].replace('_', ' ')}]({name})\n" for name in figures)]
    write_file(run_dir / "report.md", "\n".join(lines))
    write_file(run_dir / "report.html", _html(title, summary, changed, rates, times, figures,
                                                  preset_note))
