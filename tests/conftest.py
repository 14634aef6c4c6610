"""Shared fixtures: small, fast configs and a quiet environment for subprocess CLIs."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture
def cli_env(tmp_path: Path) -> dict[str, str]:
    """Environment for running ``python -m rlloop`` as a user would, from ``tmp_path``."""
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[1] / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def rlloop_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "rlloop", *args]
