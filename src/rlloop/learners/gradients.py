"""Gradient post-processing applied per optimiser between ``backward()`` and ``step()``.

Three ways to bound an update, as RLlib's learner offers them: by the global norm of all
of an optimiser's gradients together (the usual PPO choice), by each tensor's own norm,
or elementwise by value.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from rlloop.learners.gradient_clip import ClipBy as ClipBy
from rlloop.learners.gradient_clip import GradientClip as GradientClip
from rlloop.learners.gradient_clip import LearnerError as LearnerError


def grad_norm(params: Sequence[Tensor]) -> Tensor:
    """The global L2 norm of the gradients of ``params`` (zero when none has a gradient)."""
    grads = [p.grad for p in params if p.grad is not None]
    return torch.nn.utils.get_total_norm(grads) if grads else _zero(params)


def clip_gradients(params: Sequence[Tensor], clip: GradientClip,
                   norm: Tensor | None = None) -> Tensor:
    """Post-process ``.grad`` of ``params`` in place; returns the global norm before clipping.

    ``norm`` may pass in the already computed global norm to save a pass over the grads.
    """
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return _zero(params)
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


def _zero(params: Sequence[Tensor]) -> Tensor:
    """A zero norm on the parameters' device."""
    return torch.zeros((), device=params[0].device if params else "cpu")
