"""What the benchmarks that race RLlib share: the hidden ``--rllib-worker`` mode in which a
script runs itself again under an interpreter that imports ``ray.rllib``, Ray started
there, and the worker's one JSON line read back.

A script beside this one imports it (``sys.path`` holds the scripts' folder).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

SRC = Path(__file__).resolve().parents[1] / "src"

Worker = Callable[[dict[str, Any]], dict[str, Any]]


def parse_or_serve(p: argparse.ArgumentParser, argv: list[str] | None,
                   worker: Worker) -> argparse.Namespace | None:
    """``p``'s arguments, with the hidden ``--rllib-worker SPEC``. Given it, the process is
    a worker: it prints ``worker(SPEC)`` as one JSON line and None is returned. Otherwise
    torch runs on one thread (as rlloop's learner in a runner; Ray gives its actors one)
    and rlloop's sources come first on the path."""
    p.add_argument("--rllib-worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.rllib_worker:
        print(json.dumps(worker(json.loads(args.rllib_worker))), flush=True)
        return None
    import torch

    torch.set_num_threads(1)
    sys.path.insert(0, str(SRC))
    return args


def start_ray(num_cpus: int) -> None:
    """In a worker: rlloop's sources importable here and in Ray's workers (the env is
    rlloop's), then a local Ray instance of ``num_cpus`` (at least the machine's), quiet."""
    import ray

    sys.path.insert(0, str(SRC))
    os.environ["PYTHONPATH"] = os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])
    ray.init(num_cpus=max(os.cpu_count() or 1, num_cpus), include_dashboard=False,
             log_to_driver=False)


def end_report(rows: list[dict[str, Any]], json_path: str | None) -> None:
    """The machine's cores and load under a report's table; its rows to ``json_path``."""
    print(f"cores: {os.cpu_count()}, load average now: {os.getloadavg()[0]:.1f}")
    if json_path:
        Path(json_path).write_text(json.dumps(rows, indent=2))


def run_worker(python: str, script: str, spec: dict[str, Any],
               timeout_s: float) -> dict[str, Any]:
    """``script --rllib-worker SPEC`` under ``python``: its last JSON line, or a
    RuntimeError with the end of its stderr."""
    done = subprocess.run([python, script, "--rllib-worker", json.dumps(spec)],
                          capture_output=True, text=True, timeout=timeout_s)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        tail = " | ".join(done.stderr.strip().splitlines()[-5:])
        raise RuntimeError(f"RLlib run {spec} failed: {tail}")
    return dict(json.loads(lines[-1]))
