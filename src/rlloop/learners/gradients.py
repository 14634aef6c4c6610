"""Gradient post-processing applied per optimiser between ``backward()`` and ``step()``.

Three ways to bound an update, as RLlib's learner offers them: by the global norm of all
of an optimiser's gradients together (the usual PPO choice), by each tensor's own norm,
or elementwise by value.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

ClipBy = Literal["global_norm", "norm", "value"]


class LearnerError(ValueError):
    """Misuse of the learner API: unknown module or optimiser, bad params or settings."""


@dataclass
class GradientClip:
    """How gradients of one optimiser are post-processed before its step.

    Attributes:
        max: Threshold; ``None`` disables clipping.
        by: ``"global_norm"`` (all params together), ``"norm"`` (each tensor on its
            own) or ``"value"`` (elementwise to ``[-max, max]``).
        log_global_norm: Report ``<module>/gradients_<optim>_global_norm`` (the norm
            before clipping) with every update.
    """

    max: float | None = None
    by: ClipBy = "global_norm"
    log_global_norm: bool = True

    def __post_init__(self) -> None:
        if self.by not in ("global_norm", "norm", "value"):
            raise LearnerError(
                f"grad clip 'by' must be global_norm, norm or value, not {self.by!r}")
        if self.max is not None and self.max <= 0:
            raise LearnerError(f"grad clip max must be > 0 (or None to disable), got {self.max}")


def grad_norm(params: Sequence[Tensor]) -> Tensor:
    """The global L2 norm of the gradients of ``params`` (zero when none has a gradient)."""
    grads = [p.grad for p in params if p.grad is not None]
    if grads:
        return torch.nn.utils.get_total_norm(grads)
    return torch.zeros((), device=params[0].device if params else None)


def clip_gradients(params: Sequence[Tensor], clip: GradientClip,
                   norm: Tensor | None = None) -> Tensor:
    """Post-process ``.grad`` of ``params`` in place; returns the global norm before clipping.

    ``norm`` may pass in the already computed global norm to save a pass over the grads.
    """
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros((), device=params[0].device if params else None)
    if norm is None:
        norm = torch.nn.utils.get_total_norm(grads)
    if clip.max is None:
        return norm
    if clip.by == "global_norm":
        torch.nn.utils.clip_grads_with_norm_(params, clip.max, norm)
    elif clip.by == "norm":
        for g in grads:
            g.mul_((clip.max / (g.norm() + 1e-6)).clamp(max=1.0))
    else:
        for g in grads:
            g.clamp_(-clip.max, clip.max)
    return norm
