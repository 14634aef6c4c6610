"""Shared fixtures: small, fast configs and a quiet environment for subprocess CLIs."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

# Set before torch loads its OpenMP runtime (read once, then): threads waiting for work
# sleep rather than spin. Spinning, a test that asks for 2 torch threads while the other
# xdist worker holds the second core burned ~10x the CPU time (46.8 s against 4.8 s for
# benchmarks/offpolicy.py --threads 2); the rlloop processes tests start inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest
import torch
from rich.console import Console

torch.set_num_threads(1)


@pytest.fixture(autouse=True, scope="session")
def sb3_logs_in_pytest_tmp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Stable-Baselines3 makes a directory for its logger at every ``learn`` (``SB3-<time>``
    under the system's temporary directory unless ``SB3_LOGDIR`` names one): the peer
    comparisons' go under pytest's own temporary directory, which pytest prunes."""
    previous = os.environ.get("SB3_LOGDIR")
    os.environ["SB3_LOGDIR"] = str(tmp_path_factory.mktemp("sb3-logs"))
    yield
    if previous is None:
        os.environ.pop("SB3_LOGDIR", None)
    else:
        os.environ["SB3_LOGDIR"] = previous


@pytest.fixture
def float64_default() -> Iterator[None]:
    """torch's default dtype float64 for the test (a user's ``set_default_dtype``)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


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


@pytest.fixture
def cli_in_process(capsys: pytest.CaptureFixture[str]
                   ) -> Callable[[Sequence[str]], subprocess.CompletedProcess[str]]:
    """``rlloop ARGS`` run by this process's ``main``, as a finished process would report it
    (exit code, stdout, stderr): for tests where the process boundary is not what is
    checked, without a new interpreter's torch import (~2-3 s) per command."""
    from rlloop.cli.main import main

    def run(args: Sequence[str]) -> subprocess.CompletedProcess[str]:
        capsys.readouterr()  # what the test printed before is not the command's
        code = main(list(args))
        out = capsys.readouterr()
        return subprocess.CompletedProcess(list(args), code, out.out, out.err)

    return run


def leaves(node, prefix=""):
    """``(path, value)`` for every leaf of nested dicts, lists and tuples (checkpoint state)."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield from leaves(v, f"{prefix}/{k}")
    elif isinstance(node, list | tuple):
        for i, v in enumerate(node):
            yield from leaves(v, f"{prefix}/{i}")
    else:
        yield prefix, node


def same_leaf(a, b) -> bool:
    """Bit-for-bit equality of two checkpoint leaves (dtype included)."""
    import numpy as np
    import torch

    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return a.dtype == b.dtype and np.array_equal(a, b)
    return type(a) is type(b) and a == b


def env_without(package: str, tmp_path: Path) -> dict[str, str]:
    """A subprocess environment in which ``import <package>`` fails as if it were not
    installed: a path entry whose ``sitecustomize`` refuses to find it."""
    hide = tmp_path / f"hide-{package}"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(
        "import sys\n"
        "class _Hide:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name.split('.')[0] == {package!r}:\n"
        "            raise ModuleNotFoundError(name, name=name)\n"
        "sys.meta_path.insert(0, _Hide())\n")
    src = str(Path(__file__).parents[1] / "src")
    return {**os.environ, "PYTHONPATH": f"{hide}:{src}"}


class FakeClock:
    """A clock for sinks' ``clock=``: time stands until a test sets ``t``."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def plain_console(width: int = 200) -> tuple[Console, io.StringIO]:
    """A rich console writing plain lines (no terminal) into a string buffer."""
    out = io.StringIO()
    return Console(file=out, width=width), out
