"""Process checks for the env-worker tests: which children are alive, and waiting for pids."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterable

import psutil
import pytest


def is_mp_helper(proc: psutil.Process) -> bool:
    """multiprocessing's forkserver and resource tracker: one per interpreter, they hold no
    env and exit together with it (checked by the subprocess tests, which watch a whole
    process tree disappear). The forkserver's children are workers, not helpers, although
    they share its command line."""
    cmdline = " ".join(proc.cmdline())
    if "multiprocessing.resource_tracker" in cmdline:
        return True
    if "multiprocessing.forkserver" not in cmdline:
        return False
    parent = proc.parent()
    return parent is None or "multiprocessing.forkserver" not in " ".join(parent.cmdline())


def live_children(root: int | None = None) -> set[int]:
    """Live (non-zombie) descendants of ``root`` (default: this process), without helpers."""
    out = set()
    for child in psutil.Process(root).children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE and not is_mp_helper(child):
                out.add(child.pid)
        except psutil.NoSuchProcess:
            pass
    return out


def still_alive(pids: Iterable[int], timeout: float = 5.0) -> list[int]:
    """The pids among ``pids`` still running (not zombies) after up to ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        alive = []
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
            except psutil.NoSuchProcess:
                pass
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


def wait_for(condition: Callable[[], bool], proc: subprocess.Popen[str], what: str,
             timeout: float = 120.0) -> None:
    """Poll ``condition`` until it holds; fail the test if ``proc`` exits or time runs out."""
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"process exited ({proc.returncode}) before {what}:\n{out}\n{err}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)
