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


def derive_seed(seed: int, stream: str) -> int:
    """A 63-bit seed for ``stream``, a fixed function of ``(seed, stream)`` that shares
    no structure with ``seed`` itself or with other streams' seeds."""
    digest = hashlib.blake2b(f"{stream}\x00{seed}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)
