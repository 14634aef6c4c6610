"""How an optimiser's gradients are bounded: the setting, known without importing torch
(configs validate it when they are built; :mod:`rlloop.learners.gradients` applies it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

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
