"""Gradient post-processing applied per optimiser between ``backward()`` and ``step()``.

Three ways to bound an update, as RLlib's learner offers them: by the global norm of all
of an optimiser's gradients together (the usual PPO choice), by each tensor's own norm,
or elementwise by value.

The global norm and its clip are ``torch.nn.utils``' maths (``get_total_norm``,
``clip_grads_with_norm_``). On a CPU they call the foreach ops those functions call,
minus the Python that sorts the tensors into device groups: 30 µs instead of 160 µs for
a three-layer MLP, paid by every off-policy update (a CPU's foreach op runs an op per
tensor in C++, one dispatch for all of them). The results are bit-identical
(``tests/learners/test_gradients.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import torch
from torch import Tensor

from rlloop.config.gradient_clip import ClipBy as ClipBy
from rlloop.config.gradient_clip import GradientClip as GradientClip
from rlloop.config.gradient_clip import LearnerError as LearnerError


def grad_norm(params: Sequence[Tensor]) -> Tensor:
    """The global L2 norm of the gradients of ``params`` (zero when none has a gradient)."""
    grads = [p.grad for p in params if p.grad is not None]
    return total_norm(grads) if grads else _zero(params)


def total_norm(grads: Sequence[Tensor]) -> Tensor:
    """``get_total_norm(grads)``: the L2 norm of all of ``grads`` together (not empty)."""
    if _per_tensor(grads):
        return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(cast(list[Tensor], grads))))
    return torch.nn.utils.get_total_norm(grads)


def clip_to_norm_(params: Sequence[Tensor], max_norm: float, norm: Tensor) -> None:
    """``clip_grads_with_norm_``: scale the gradients of ``params`` in place by ``min(1,
    max_norm / (norm + 1e-6))``, ``norm`` being their global norm (a tensor: no host
    sync)."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    if not _per_tensor(grads):
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
        return
    torch._foreach_mul_(grads, clip_scale(max_norm, norm))


def clip_scale(max_norm: float, norm: Tensor) -> Tensor:
    """``clip_grads_with_norm_``'s factor ``min(1, max_norm / (norm + 1e-6))``."""
    return torch.clamp(max_norm / (norm + 1e-6), max=1.0)


def _per_tensor(grads: Sequence[Tensor]) -> bool:
    """Whether ``grads`` take the direct foreach path: CPU tensors (whose foreach ops run
    an op per tensor, in C++), outside a compiled graph (which fuses either form, and
    traces torch's own)."""
    return grads[0].device.type == "cpu" and not torch.compiler.is_compiling()


def clip_gradients(params: Sequence[Tensor], clip: GradientClip,
                   norm: Tensor | None = None) -> Tensor:
    """Post-process ``.grad`` of ``params`` in place; returns the global norm before clipping.

    ``norm`` may pass in the already computed global norm to save a pass over the grads.
    """
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return _zero(params)
    if norm is None:
        norm = total_norm(grads)
    if clip.max is None:
        return norm
    if clip.by == "global_norm":
        clip_to_norm_(params, clip.max, norm)
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
