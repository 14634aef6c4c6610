"""An optimiser's parameters and gradients, each as views of one flat buffer.

An eager update of a small network is mostly per-tensor overhead: a CPU's foreach ops and
fused Adam run one kernel per tensor, so the global norm, the clip and Adam's step each
cost six dispatches for a three-layer MLP. With the parameters and their gradients laid
out in one buffer each, every one of them is one op over the whole buffer, and Adam's
moments (:meth:`rlloop.learners.adam.Adam.use_flat`) follow the same layout.

The module keeps ordinary parameters: each one's ``.data`` and ``.grad`` are views of the
buffers, so the module's forward, ``state_dict``/``load_state_dict`` (which copy into the
views) and checkpoints (which save copies of tensors that share memory) work as before.
Anything that rebinds a parameter or its gradient (``p.grad = None``, ``p.data = x``,
``module.to(dtype)``) leaves the layout; :meth:`FlatParameters.intact` sees it and
:meth:`FlatParameters.restore` lays the current values out again.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def flat_views(flat: Tensor, like: Sequence[Tensor]) -> list[Tensor]:
    """``flat`` (as many elements as ``like`` together) cut into views shaped as the
    tensors of ``like``, in order."""
    return [v.view(t.shape) for v, t in zip(flat.split([t.numel() for t in like]), like,
                                            strict=True)]


class FlatParameters:
    """``params`` (one dtype, one device) with their values in :attr:`data` and their
    gradients in :attr:`grad`, both flat; the parameters' own ``.data`` and ``.grad``
    are views of them."""

    #: Gradients are scratch: every update writes them before anything reads them.
    transient_attrs = frozenset({"grad", "grad_views"})

    def __init__(self, params: Sequence[Tensor]) -> None:
        self.params = list(params)
        first = self.params[0]
        if any(p.dtype != first.dtype or p.device != first.device for p in self.params):
            raise ValueError("FlatParameters takes parameters of one dtype on one device")
        self.data = torch.empty(sum(p.numel() for p in self.params), dtype=first.dtype,
                                device=first.device)
        self.grad = torch.zeros_like(self.data)
        self.data_views: list[Tensor] = []
        self.grad_views: list[Tensor] = []
        self.restore()

    def views(self, flat: Tensor) -> list[Tensor]:
        """``flat`` cut into tensors of the parameters' shapes, in order."""
        return flat_views(flat, self.params)

    def restore(self) -> None:
        """Copy the parameters' current values (and gradients, zero where None) into the
        buffers and make their ``.data`` and ``.grad`` views of them again."""
        with torch.no_grad():  # (cat, then copy: the parameters may be views of the buffers)
            self.data.copy_(torch.cat([p.detach().reshape(-1) for p in self.params]))
            self.grad.copy_(torch.cat([
                (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                for p in self.params]))
        self.data_views, self.grad_views = self.views(self.data), self.views(self.grad)
        for p, data, grad in zip(self.params, self.data_views, self.grad_views, strict=True):
            p.data = data
            p.grad = grad

    def intact(self) -> bool:
        """Whether every parameter's gradient is still its view of :attr:`grad` and its
        values still live in :attr:`data` (a few pointer reads, no device work)."""
        return all(p.grad is g and p.data_ptr() == v.data_ptr() for p, g, v in
                   zip(self.params, self.grad_views, self.data_views, strict=True))
