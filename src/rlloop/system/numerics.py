"""Floating-point settings the trainers run under.

Subnormal ("denormal") floats are numbers too small for float32's normal range (below
about 1.2e-38). x86 CPUs handle them in microcode, tens of times slower than normal
numbers, and small RL networks make them all the time: Adam's second-moment estimates of
rarely-active weights decay towards zero, as do the gradients of saturated units. On
this library's DQN and SAC benchmarks the fused Adam kernel ran 7x slower once its state
held subnormals, and a whole update 1.3-1.8x slower.

:func:`flushed_denormals` turns on flush-to-zero (``torch.set_flush_denormal``) for the
block it wraps and restores the previous mode afterwards, so code around a trainer is
not affected. The trainers wrap each step in it unless built with
``flush_denormal=False``. Flushing replaces numbers below 1.2e-38 by zero, far below
anything that moves a float32 network. It sets the calling thread's mode, which covers
the single-threaded small-tensor kernels RL updates run.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

# On the CPU by name: flush-to-zero is a CPU mode, and under a user's
# ``torch.set_default_device`` an unnamed device would put the probe on "meta" or a GPU.
_SUBNORMAL = torch.tensor(1e-39, dtype=torch.float32, device="cpu")


def flushing_denormals() -> bool:
    """Whether this thread flushes subnormal floats to zero now."""
    return not bool(_SUBNORMAL.mul(1.0))


@contextmanager
def flushed_denormals(enabled: bool = True) -> Iterator[None]:
    """Flush subnormal floats to zero inside the block (a no-op when ``enabled`` is False
    or the CPU does not support it); the previous mode is restored on exit."""
    if not enabled or flushing_denormals():
        yield
        return
    if not torch.set_flush_denormal(True):  # not supported on this CPU
        yield
        return
    try:
        yield
    finally:
        torch.set_flush_denormal(False)
