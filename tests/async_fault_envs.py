"""Gymnasium envs for the gymnasium-async fault tests, registered on import.

Train them as ``--env async_fault_envs:Fault-v0`` (Gymnasium imports this module in the
trainer and in every worker process). Torch-free on purpose: workers import it.

``Fault-v0`` has no ``unwrapped.state`` (like LunarLander, MuJoCo or Atari), so the async
backend cannot save its physics. Its faults fire once per token file (``os.unlink`` is
atomic, so exactly one worker takes each token, across restarts and resumed runs): after
``fault_after`` steps of one env instance, it claims a token from ``token_dir`` and then
``"raise"``s, ``"segfault"``s (a real SIGSEGV) or ``"hang"``s (sleeps ``hang_s``). Every
instance writes its pid to ``pid_dir``, so a test knows every process that held an env.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces
from worker_envs import claim_token


class FaultEnv(gymnasium.Env[np.ndarray, int]):
    """Observe a random sign, get 1 for the matching action; 20 steps per episode."""

    def __init__(self, fault: str | None = None, token_dir: str | None = None,
                 fault_after: int = 40, hang_s: float = 3600.0,
                 pid_dir: str | None = None) -> None:
        self.observation_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = spaces.Discrete(2)
        self.fault, self.token_dir, self.fault_after = fault, token_dir, fault_after
        self.hang_s = hang_s
        self.steps = 0
        self.t = 0
        self.sign = 1.0
        if pid_dir is not None:
            Path(pid_dir).mkdir(parents=True, exist_ok=True)
            (Path(pid_dir) / str(os.getpid())).touch()

    def _obs(self) -> np.ndarray:
        return np.array([self.sign, self.t / 20.0], dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.t = 0
        self.sign = float(self.np_random.choice([-1.0, 1.0]))
        return self._obs(), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.steps += 1
        if self.steps >= self.fault_after and claim_token(self.token_dir):
            self._fail()
        reward = float(int(action) == (1 if self.sign > 0 else 0))
        self.t += 1
        self.sign = float(self.np_random.choice([-1.0, 1.0]))
        return self._obs(), reward, False, self.t >= 20, {}

    def _fail(self) -> None:
        if self.fault == "raise":
            raise RuntimeError("injected fault: the env raised")
        if self.fault == "segfault":
            os.kill(os.getpid(), signal.SIGSEGV)
        if self.fault == "hang":
            time.sleep(self.hang_s)


gymnasium.register("Fault-v0", entry_point=FaultEnv)
