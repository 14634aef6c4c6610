"""Figures drawn from the benchmark result files committed under ``benchmarks/``.

Each file is JSONL, one measured row a line; a *kind* says which fields its rows must
carry and how they are drawn:

- ``zoo``: final returns per env beside rl-zoo's published score (``zoo_results.jsonl``);
- ``solve``: env steps, seconds and throughput to a return threshold per contender and
  seed (``recurrent_results.jsonl``);
- ``curve``: evaluation return along training per seed, against a reference contender's
  level (``multi_agent_results.jsonl``).

Kept apart from the Sphinx directive so that a test can check a committed file against
the fields read here without building the site: a file that lost a field fails the test,
not only the docs build.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

#: The fields every row of a kind must have: what the drawing below reads.
FIELDS: dict[str, frozenset[str]] = {
    "zoo": frozenset({"env", "algo", "seed", "return_mean"}),
    "solve": frozenset(
        {
            "contender",
            "seed",
            "solved",
            "solve_steps",
            "solve_s",
            "train_sps",
            "final_return",
            "budget",
            "date",
            "machine",
        }
    ),
    "curve": frozenset({"contender", "seed", "env_steps", "return_mean", "date", "machine"}),
}

#: The contender a ``curve`` file measures against (a horizontal line, not a curve).
REFERENCE = "random"


class ResultFileError(ValueError):
    """A result file the figure cannot be drawn from; the message names the file and fix."""


def read_rows(path: Path, kind: str) -> list[dict[str, Any]]:
    """Every row of ``path``, each checked for :data:`FIELDS` of ``kind``; a file with no
    rows, a line that is not JSON or a row without a field is an error, since a figure
    drawn from part of a file would show less than the page says."""
    if kind not in FIELDS:
        raise ResultFileError(f"unknown figure kind {kind!r}; choose one of {sorted(FIELDS)}")
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ResultFileError(
                f"{path.name} line {number} is not JSON ({e.msg}); "
                "remove the line or measure it again"
            ) from None
        missing = FIELDS[kind] - set(row)
        if missing:
            raise ResultFileError(
                f"{path.name} line {number} lacks {sorted(missing)}, which "
                f"a {kind!r} figure reads; measure it again with the script"
            )
        rows.append(row)
    if not rows:
        raise ResultFileError(
            f"{path.name} has no rows; run its benchmark script with --results to measure some"
        )
    return rows


def measured_on(rows: list[dict[str, Any]]) -> str:
    """``measured <dates> on <machines>``, from the rows that record them ('' if none do)."""
    dates = sorted({r["date"] for r in rows if r.get("date")})
    machines = sorted({r["machine"] for r in rows if r.get("machine")})
    if not dates:
        return ""
    when = dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}"
    return f"measured {when} on {'; '.join(machines) or 'an unrecorded machine'}"


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, out: Path) -> None:
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    _pyplot().close(fig)


def draw_zoo(
    rows: list[dict[str, Any]], algo: str, zoo: dict[str, dict[str, Any]], out: Path
) -> bool:
    """rlloop's final returns per env (one dot per seed) beside rl-zoo's published score
    (``zoo``: env -> ``{"zoo_score", "zoo_std"}``); False when no row is for ``algo``."""
    rows = [r for r in rows if r["algo"] == algo and r["return_mean"] is not None]
    envs = sorted({r["env"] for r in rows})
    if not envs:
        return False
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(envs), figsize=(2.2 * len(envs) + 1, 2.8), squeeze=False)
    for ax, env in zip(axes[0], envs, strict=True):
        returns = [r["return_mean"] for r in rows if r["env"] == env]
        ax.scatter([0] * len(returns), returns, label="rlloop (one dot per seed)")
        score = zoo.get(env, {}).get("zoo_score")
        if score is not None:
            ax.errorbar(
                [1],
                [score],
                yerr=[zoo[env].get("zoo_std") or 0],
                fmt="s",
                color="tab:orange",
                label="rl-zoo (published)",
            )
        ax.set_xticks([0, 1], ["rlloop", "rl-zoo"])
        ax.set_xlim(-0.6, 1.6)
        ax.set_title(env, fontsize=8)
    axes[0][0].set_ylabel("evaluation return")
    _save(fig, out)
    return True


def draw_solve(rows: list[dict[str, Any]], out: Path) -> None:
    """Per contender (one dot per seed): env steps and training seconds to the threshold,
    and training env steps per second. A seed that never reached it is a hollow dot at
    its budget: its steps and seconds are lower bounds."""
    plt = _pyplot()
    contenders = list(dict.fromkeys(r["contender"] for r in rows))
    panels = [
        ("solve_steps", "env steps to solve", False),
        ("solve_s", "training seconds to solve", True),
        ("train_sps", "training env steps / s", True),
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(9.5, 3.0))
    for ax, (field, label, log) in zip(axes, panels, strict=True):
        for x, name in enumerate(contenders):
            mine = [r for r in rows if r["contender"] == name]
            for solved, style in ((True, {}), (False, {"facecolors": "none"})):
                values = [r[field] for r in mine if bool(r["solved"]) is solved]
                if values:
                    ax.scatter(
                        [x] * len(values),
                        values,
                        color=f"C{x}",
                        **style,
                        label=None if solved else "not solved (at its budget)",
                    )
        ax.set_xticks(range(len(contenders)), contenders, fontsize=8)
        ax.set_xlim(-0.6, len(contenders) - 0.4)
        ax.set_title(label, fontsize=9)
        if log:
            ax.set_yscale("log")
    handles, labels = axes[0].get_legend_handles_labels()
    if handles:
        axes[0].legend(handles[:1], labels[:1], fontsize=7)
    _save(fig, out)


def draw_curve(rows: list[dict[str, Any]], out: Path, ylabel: str = "evaluation return") -> None:
    """Evaluation return (``ylabel``: what it counts) against env steps, one line per seed
    of each trained contender, and the :data:`REFERENCE` contender's mean over its rows as
    a dashed line."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.0, 3.2))
    trained = list(dict.fromkeys(r["contender"] for r in rows if r["contender"] != REFERENCE))
    for c, name in enumerate(trained):
        for s, seed in enumerate(sorted({r["seed"] for r in rows if r["contender"] == name})):
            points = sorted(
                (r["env_steps"], r["return_mean"])
                for r in rows
                if r["contender"] == name and r["seed"] == seed
            )
            ax.plot(
                *zip(*points, strict=True),
                marker=".",
                color=f"C{c}",
                alpha=0.8,
                label=f"{name} (one line per seed)" if s == 0 else None,
            )
    reference = [r["return_mean"] for r in rows if r["contender"] == REFERENCE]
    if reference:
        ax.axhline(
            statistics.fmean(reference),
            linestyle="--",
            color="gray",
            label=f"{REFERENCE} player (mean of {len(reference)} seeds)",
        )
    ax.set_xlabel("env steps")
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=7)
    _save(fig, out)
