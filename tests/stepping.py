"""Driving an algorithm's collect/update cycle by hand, as the trainer does, for tests that
inspect its buffers between iterations."""

from __future__ import annotations

from typing import Any


def run_steps(algorithm: Any, env_steps: int) -> int:
    """Collect and update until at least ``env_steps`` env steps; returns the steps taken."""
    steps = 0
    while steps < env_steps:
        steps += int(algorithm.collect()["env/steps"])
        algorithm.update(steps)
    return steps


def run_iterations(algorithm: Any, iterations: int) -> int:
    """``iterations`` collect/update cycles; returns the env steps taken."""
    steps = 0
    for _ in range(iterations):
        steps += int(algorithm.collect()["env/steps"])
        algorithm.update(steps)
    return steps
