"""rlloop: a fast, exact-resume reinforcement-learning trainer on PyTorch."""

from __future__ import annotations

__version__ = "0.1.0"
