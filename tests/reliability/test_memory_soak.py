"""Memory stays flat: a full replay buffer and a long PPO run do not grow RSS.

Tolerances are stated in MiB: the allocator may keep a few pages, but anything that
grows per iteration (a list of stats, tensors kept alive) would exceed them.
"""

from __future__ import annotations

import gc

import psutil
import torch

from rlloop.data.replay import ReplayBuffer
from rlloop.data.transitions import Transitions
from rlloop.runs.build import build_algorithm
from rlloop.trainers.loop import Trainer

from ._algos import small_config

MiB = 1 << 20


def _rss() -> int:
    gc.collect()
    return psutil.Process().memory_info().rss


def test_replay_buffer_memory_is_fixed_once_full():
    buf = ReplayBuffer(20_000, (64,), (), torch.int64)
    g = torch.Generator().manual_seed(0)
    n = 32

    def batch():
        return Transitions(torch.randn(n, 64), torch.randint(2, (n,)), torch.randn(n),
                           torch.randn(n, 64), torch.zeros(n, dtype=torch.bool),
                           torch.full((n,), 0.99))

    for _ in range(20_000 // n + 10):  # fill, and wrap around
        buf.add(batch())
    for _ in range(300):
        buf.sample(256, g)
    before = _rss()
    for _ in range(3000):
        buf.add(batch())
        buf.sample(256, g)
    grown = (_rss() - before) / MiB
    assert len(buf) == 20_000
    assert grown < 8, f"RSS grew {grown:.1f} MiB over 3000 add+sample iterations"


def test_ppo_training_memory_is_flat():
    algo = build_algorithm(small_config("ppo"))
    trainer = Trainer(algo, eval_episodes=2)
    for _ in range(50):
        trainer.step()
    before = _rss()
    for i in range(400):
        trainer.step()
        if i % 100 == 0:
            trainer.eval()
    grown = (_rss() - before) / MiB
    algo.close()
    assert grown < 8, f"RSS grew {grown:.1f} MiB over 400 PPO iterations"
