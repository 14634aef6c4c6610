"""A CartPole whose ``step()`` sleeps forever after a number of steps: an in-process env
that hangs (a simulator or server that stopped answering).

Importing this module registers it, so ``--env hanging_env:HangingCartPole-v0`` reaches it
through Gymnasium's ``module:Env-v0`` ids (with this folder on ``PYTHONPATH``).
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import gymnasium

ENV_ID = "HangingCartPole-v0"


class HangInStep(gymnasium.Wrapper):
    """Steps normally ``after`` times, then touches ``flag`` and sleeps in ``step()`` until
    interrupted. With ``other_thread``, the main thread blocks the stop signals while it
    sleeps, so that the kernel gives them to another of the process's threads, as it does
    when the main thread already has a signal pending (SIGINT and SIGTERM sent together)."""

    def __init__(self, env: gymnasium.Env, after: int, flag: str, other_thread: bool) -> None:
        super().__init__(env)
        self.after, self.flag, self.other_thread = after, flag, other_thread
        self.steps = 0

    def step(self, action: Any) -> Any:
        self.steps += 1
        if self.steps <= self.after:
            return self.env.step(action)
        stops = {signal.SIGTERM, signal.SIGINT}
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, stops) if self.other_thread else None
        Path(self.flag).touch()
        try:
            while True:
                time.sleep(3600)
        finally:
            if mask is not None:
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def make(after: int = 100, flag: str = "hanging", other_thread: bool = False,
         **kwargs: Any) -> gymnasium.Env:
    return HangInStep(gymnasium.make("CartPole-v1", **kwargs), after, flag, other_thread)


if ENV_ID not in gymnasium.registry:
    gymnasium.register(ENV_ID, entry_point=make, disable_env_checker=True)
