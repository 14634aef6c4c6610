"""The committed result files the benchmark scripts write and the docs draw figures from.

One JSON object a line (JSONL), appended one measured row at a time, so that a run killed
part-way keeps what it measured and a later sitting adds to the same file. Every row
carries where and when it was measured (:func:`stamp`), since a figure on a docs page has
to name the machine and the date its numbers came from.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def load_rows(path: Path) -> list[dict[str, Any]]:
    """Every row of ``path`` (none when it does not exist yet); a last line cut short by
    a killed sitting is skipped, not an error."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


def append_row(path: Path, row: dict[str, Any]) -> None:
    """Add ``row`` as the last line of ``path`` (created if missing); one writer per file."""
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")


def machine() -> str:
    """The CPU model, its core count and the widest matrix instructions it has: what a
    CPU timing depends on most."""
    model, flags = platform.processor() or platform.machine(), set()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text(encoding="utf-8").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
                break
    isa = next(
        (
            name
            for flag, name in (("amx_tile", "AMX"), ("avx512f", "AVX-512"), ("avx2", "AVX2"))
            if flag in flags
        ),
        None,
    )
    return f"{model}, {os.cpu_count()} cores" + (f" ({isa})" if isa else "")


@cache
def provenance() -> dict[str, str]:
    """What a row was measured with: rlloop's commit (``+dirty`` when the working tree had
    changes) and the versions that shape the numbers. Read once per process: call it before
    measuring, so that a commit made while a long run goes on is not credited with it."""
    from importlib.metadata import version

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=HERE, capture_output=True, text=True, check=False)
        return done.stdout.strip() if done.returncode == 0 else ""

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = "+dirty" if git("status", "--porcelain", "--untracked-files=no") else ""
    return {
        "commit": commit + dirty,
        **{f"{name}_version": version(name) for name in ("torch", "gymnasium", "numpy")},
    }


def stamp(load_before: float) -> dict[str, Any]:
    """The fields every row ends with: the date (UTC), the machine, the one-minute load
    average before (``load_before``, read by the caller when the measurement started) and
    after it, and :func:`provenance`."""
    return {
        "date": datetime.now(UTC).date().isoformat(),
        "machine": machine(),
        "load_before": round(load_before, 2),
        "load_after": round(os.getloadavg()[0], 2),
        **provenance(),
    }
