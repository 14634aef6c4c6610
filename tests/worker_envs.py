"""Small Gymnasium-style test envs for the worker pool, the sampler and the task API.

Torch-free on purpose: process workers import this module, and importing torch there
would cost seconds per worker start.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
from gymnasium import spaces


class CountingEnv:
    """Observation ``[t, seed]`` (``seed``: the one of its first reset, -1 if none).

    Episode ``i`` lasts ``lengths[i % len(lengths)]`` steps; every step pays 1. Each step
    sleeps ``delays.get(seed, delay)`` seconds, so tests can slow down chosen workers
    (worker ``r`` gets seed ``env_seed + r``).
    """

    def __init__(self, lengths: tuple[int, ...] = (5,), delay: float = 0.0,
                 delays: dict[int, float] | None = None) -> None:
        self.lengths, self.default_delay, self.delays = lengths, delay, delays or {}
        self.seed = -1
        self.episode = -1
        self.t = 0
        self.action_space = spaces.Discrete(2)
        self.metadata: dict[str, Any] = {"render_fps": 10}

    def _obs(self) -> np.ndarray:
        return np.array([self.t, self.seed], dtype=np.float32)

    def reset(self, seed: int | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        if seed is not None:
            self.seed = seed
        self.episode += 1
        self.t = 0
        return self._obs(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        delay = self.delays.get(self.seed, self.default_delay)
        if delay:
            time.sleep(delay)
        self.t += 1
        done = self.t >= self.lengths[self.episode % len(self.lengths)]
        return self._obs(), 1.0, done, False, {}

    def render(self) -> np.ndarray:
        frame = np.zeros((16, 24, 3), dtype=np.uint8)
        frame[:, : min(self.t, 24)] = 255
        return frame

    def close(self) -> None:
        pass


class SignEnv:
    """A learnable toy: observe a random sign, get 1 for the matching action (1 for +),
    10 steps per episode. A random policy earns about 5, a learned one 10.

    Faults: on each step, with probability ``fault_prob``, the env tries to claim one
    token file from ``token_dir`` (os.unlink is atomic, so each token fires exactly once
    across all workers and restarts) and then ``fault``s: "raise", "kill" (SIGKILL its
    own process) or "hang" (sleep ``hang_s``). ``nan_every``: every that many steps the
    observation and the reward are NaN.
    """

    def __init__(self, fault: str | None = None, token_dir: str | None = None,
                 fault_prob: float = 0.02, hang_s: float = 30.0, nan_every: int = 0,
                 episode_length: int = 10) -> None:
        self.fault, self.token_dir, self.fault_prob = fault, token_dir, fault_prob
        self.hang_s, self.nan_every, self.length = hang_s, nan_every, episode_length
        self.rng = np.random.default_rng()
        self.t = 0
        self.steps = 0
        self.sign = 1.0
        self.action_space = spaces.Discrete(2)
        self.metadata: dict[str, Any] = {}

    def _obs(self) -> np.ndarray:
        return np.array([self.sign], dtype=np.float32)

    def reset(self, seed: int | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.t = 0
        self.sign = float(self.rng.choice([-1.0, 1.0]))
        return self._obs(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self._maybe_fault()
        reward = float(int(action) == (1 if self.sign > 0 else 0))
        self.t += 1
        self.steps += 1
        self.sign = float(self.rng.choice([-1.0, 1.0]))
        obs = self._obs()
        if self.nan_every and self.steps % self.nan_every == 0:
            obs, reward = np.full_like(obs, np.nan), float("nan")
        return obs, reward, self.t >= self.length, False, {}

    def _maybe_fault(self) -> None:
        if self.fault is None or self.rng.random() >= self.fault_prob:
            return
        if not claim_token(self.token_dir):
            return
        if self.fault == "raise":
            raise RuntimeError("injected fault: the env raised")
        if self.fault == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if self.fault == "hang":
            time.sleep(self.hang_s)

    def render(self) -> None:
        return None

    def close(self) -> None:
        pass


def make_tokens(token_dir: Path, count: int) -> None:
    token_dir.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        (token_dir / f"{i}.token").touch()


def tokens_left(token_dir: Path) -> int:
    return len(list(token_dir.glob("*.token")))


def claim_token(token_dir: str | None) -> bool:
    if token_dir is None:
        return False
    for token in sorted(Path(token_dir).glob("*.token")):
        try:
            token.unlink()
            return True
        except FileNotFoundError:
            continue  # another worker took it first
    return False
