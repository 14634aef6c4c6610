"""The gradient update of the off-policy learners, with as little Python as possible.

Off-policy learners make thousands of small updates per second: for a 256x256 MLP on one
CPU thread the maths of an update takes a few hundred microseconds, and the generic
path costs as much again. ``Learner.update_minibatch`` checks finiteness (which waits
on the result) and logs metrics per update; ``clip_grad_norm_``, ``zero_grad`` and
``Adam.step`` each group tensors by device and dtype and enter profiler scopes.
:func:`gradient_step` keeps only the arithmetic: the same global-norm clipping as
``clip_grad_norm_`` and, for ``Adam(fused=True)``, the same fused kernel that
``Adam.step`` ends in, called on cached state lists. Results are bit-identical to the
generic path (``tests/test_sac_td3.py`` checks it).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

_ExpAvgs = tuple[list[Tensor], list[Tensor], list[Tensor]]


class LeanOptim:
    """One optimiser of a learner (registered there too, so its state is checkpointed).

    Args:
        optimizer: Any optimiser; a single-group ``Adam(fused=True)`` takes the fast path.
        params: Exactly the tensors ``optimizer`` updates.
        max_grad_norm: Clip the global gradient norm of ``params`` to this (None: off).
    """

    transient_attrs = frozenset({"_adam"})  # a cache of views into optimizer.state

    def __init__(self, optimizer: torch.optim.Optimizer, params: Sequence[Tensor],
                 max_grad_norm: float | None = None) -> None:
        self.optimizer = optimizer
        self.params = list(params)
        self.max_grad_norm = max_grad_norm
        self._adam: _ExpAvgs | None = None

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        """Clip, then step; parameters without a gradient are left alone (as Adam does)."""
        grads = [p.grad for p in self.params]
        if any(g is None for g in grads):
            if all(g is None for g in grads):
                return  # e.g. TD3's actor between its delayed updates
            present = [g for g in grads if g is not None]
            if self.max_grad_norm is not None:
                clip_global_norm(present, self.max_grad_norm)
            self.optimizer.step()
            return
        dense = [g for g in grads if g is not None]  # all of them; typed for mypy
        if self.max_grad_norm is not None:
            clip_global_norm(dense, self.max_grad_norm)
        state = self._fused_adam_state()
        if state is None:
            self.optimizer.step()
            return
        exp_avgs, exp_avg_sqs, steps = state
        group = self.optimizer.param_groups[0]
        beta1, beta2 = group["betas"]
        torch._foreach_add_(steps, 1)
        torch._fused_adam_(self.params, dense, exp_avgs, exp_avg_sqs, [], steps,
                           amsgrad=False, lr=group["lr"], beta1=beta1, beta2=beta2,
                           weight_decay=group["weight_decay"], eps=group["eps"],
                           maximize=False, grad_scale=None, found_inf=None)

    def _fused_adam_state(self) -> _ExpAvgs | None:
        """Adam's state lists when the fused kernel applies, else None (use ``step()``)."""
        opt = self.optimizer
        if type(opt) is not torch.optim.Adam or len(opt.param_groups) != 1:
            return None
        group = opt.param_groups[0]
        if (not group["fused"] or group["amsgrad"] or group["maximize"]
                or group["capturable"] or group["differentiable"]
                or group.get("decoupled_weight_decay") or isinstance(group["lr"], Tensor)):
            return None
        first = opt.state.get(self.params[0])
        if self._adam is not None and first and first["exp_avg"] is self._adam[0][0]:
            return self._adam
        states = [opt.state.get(p) or {} for p in self.params]
        if not all(states):  # before the first step: Adam.step initialises the state
            return None
        self._adam = ([s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states],
                      [s["step"] for s in states])
        return self._adam


def clip_global_norm(grads: list[Tensor], max_norm: float) -> Tensor:
    """Scale ``grads`` in place so their global L2 norm is at most ``max_norm``; returns
    the norm before clipping (the arithmetic of ``torch.nn.utils.clip_grad_norm_``)."""
    norms = torch._foreach_norm(grads)
    total = torch.linalg.vector_norm(torch.stack(norms))
    torch._foreach_mul_(grads, torch.clamp(max_norm / (total + 1e-6), max=1.0))
    return total


def gradient_step(loss: Tensor, optims: Sequence[LeanOptim]) -> None:
    """``loss.backward()``, then clip and step every optimiser: one gradient update."""
    for o in optims:
        o.zero_grad()
    loss.backward()  # type: ignore[no-untyped-call]
    for o in optims:
        o.step()
