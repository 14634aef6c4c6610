"""Independent random streams from one user seed.

Two ``torch.Generator``s seeded with the same integer produce the same numbers. A run
seeds several from its one ``seed`` (the algorithm's draws, a native env's resets), so
each is seeded with :func:`derive_seed` of the seed and its own stream name instead:
otherwise, say, the exploration draws of step ``t`` would be the reset draws of some
earlier step, a correlation that measurably hurt DQN on native CartPole (final returns
about half of those on Gymnasium's CartPole, whose resets use NumPy's generator).
"""

from __future__ import annotations

import hashlib
import random

import numpy as np


def derive_seed(seed: int, stream: str) -> int:
    """A 63-bit seed for ``stream``, a fixed function of ``(seed, stream)`` that shares
    no structure with ``seed`` itself or with other streams' seeds."""
    digest = hashlib.blake2b(f"{stream}\x00{seed}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


def seed_global_rngs(seed: int) -> None:
    """Seed torch's, NumPy's and Python's global generators from ``seed``.

    rlloop's own draws use its generators; the global ones matter for what it does not
    control (a user's env drawing from ``np.random``), and a checkpoint saves them, so
    they must start from the seed for a run to be reproducible and to resume exactly.
    """
    import torch  # here: an env worker process seeds its host RNGs without torch

    torch.manual_seed(seed)
    seed_host_rngs(seed)


def seed_host_rngs(seed: int) -> None:
    """Seed NumPy's and Python's global generators from ``seed`` (as `seed_global_rngs`)."""
    np.random.seed(derive_seed(seed, "numpy") % 2**32)
    random.seed(derive_seed(seed, "python"))
