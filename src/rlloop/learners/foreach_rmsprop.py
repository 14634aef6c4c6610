"""RMSprop whose plain step on a CPU runs on its state as one flat tensor.

A2C takes one optimiser step per rollout of a few dozen env steps, so the step's cost is a
visible share of its iteration. torch's ``RMSprop.step`` sorts the tensors into device
groups, checks its options and wraps its functional form around six foreach ops, and on a
CPU a foreach op is one kernel call per tensor: for a [64, 64] actor-critic's twelve
parameters that is about 150 µs a step, nearly all of it per-tensor dispatch (the
arithmetic on 8.6k numbers takes a few µs). In the setting rl-zoo and Stable-Baselines3
run A2C in (one parameter group on the CPU, ``foreach=True``, no momentum, centring,
weight decay or ``maximize``, a float learning rate, every state made by a first step of
torch's) :class:`ForeachRMSprop` keeps every parameter's ``square_avg`` as a view of one
flat tensor and every ``step`` as an element of another, copies the gradients into a flat
tensor beside them, and runs torch's ops on those: one kernel call each instead of twelve,
about 40 µs a step. The ops are elementwise and taken in torch's order (the parameters'
``addcdiv`` on per-parameter views, exactly torch's), so parameters and state are
bit-identical (``tests/learners/test_foreach_rmsprop.py``). A state replaced from outside
(``load_state_dict``) is gathered into flat tensors again at the next step. Any other
setting, a closure or a compiled graph takes torch's step; step hooks run around either
(the wrapper ``Optimizer`` puts on every optimiser class's ``step``).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import Tensor

from rlloop.learners.adam import RMSprop
from rlloop.learners.flat_buffers import flat_views


class _FlatState(NamedTuple):
    """The state of ``params`` as flat tensors and, per parameter, views of them (in the
    parameter's shape) that the optimiser's ``state`` holds."""

    params: tuple[Tensor, ...]
    state: Any  # the optimiser's state mapping they were made in
    states: tuple[dict[str, Any], ...]  # its entries for ``params``
    square_avg: Tensor  # [numel of all params]
    steps: Tensor  # [len(params)]
    square_avg_views: tuple[Tensor, ...]
    step_views: tuple[Tensor, ...]
    grad: Tensor  # the gradients copied in, flat
    grad_views: tuple[Tensor, ...]
    avg: Tensor  # sqrt(square_avg) + eps, flat
    avg_views: tuple[Tensor, ...]


class ForeachRMSprop(RMSprop):
    """:class:`~rlloop.learners.adam.RMSprop` (same arguments, state and results) with the
    flat step the module docstring describes."""

    #: Made at the first flat step; a class default, as torch's pickling and copying of an
    #: optimiser keep only its defaults, state and groups (a copy makes its own).
    _flat: _FlatState | None = None
    #: ``_flat`` is derived: its tensors hold the values ``state`` has (which checkpoints
    #: save), and a loaded state is gathered into new ones at the next step.
    transient_attrs = frozenset({"_flat"})

    def step(self, closure: Callable[[], float] | None = None) -> Any:  # type: ignore[override]
        flat = None if closure is not None else self._plain_step_state()
        if flat is None:
            return super().step(closure)
        group = self.param_groups[0]
        alpha, eps, lr = group["alpha"], group["eps"], group["lr"]
        with torch.no_grad():
            # torch's _multi_tensor_rmsprop for CPU step counts, op for op, on flat tensors.
            flat.steps.add_(1.0)
            grads = [p.grad for p in flat.params]  # none is None: _plain_step_state saw them
            torch._foreach_copy_(flat.grad_views, grads)  # type: ignore[arg-type]
            flat.square_avg.mul_(alpha)
            flat.square_avg.addcmul_(flat.grad, flat.grad, value=1 - alpha)
            torch.sqrt(flat.square_avg, out=flat.avg)
            flat.avg.add_(eps)
            torch._foreach_addcdiv_(flat.params, flat.grad_views, flat.avg_views, value=-lr)
        return None

    def _plain_step_state(self) -> _FlatState | None:
        """The flat state of the parameters that have a gradient, made or checked here,
        where this step may run on it; else None."""
        if len(self.param_groups) != 1 or torch.compiler.is_compiling():
            return None
        group = self.param_groups[0]
        if not (group["foreach"] and group["momentum"] == 0 and not group["centered"]
                and group["weight_decay"] == 0 and not group["maximize"]
                and not group["differentiable"] and not group["capturable"]
                and isinstance(group["lr"], float)):
            return None
        params = tuple(p for p in group["params"] if p.grad is not None)
        flat = self._flat
        # Identities only (a lookup keyed by a tensor hashes it: 12 of them cost ~10 µs);
        # load_state_dict replaces the whole state mapping.
        if (flat is not None and self.state is flat.state and len(flat.params) == len(params)
                and all(map(operator.is_, params, flat.params))
                and all(s.get("square_avg") is a and s.get("step") is n for s, a, n in zip(
                    flat.states, flat.square_avg_views, flat.step_views, strict=True))):
            return flat
        self._flat = None  # the parameters with gradients or their state changed
        return self._flatten(params) if params else None

    def _flatten(self, params: tuple[Tensor, ...]) -> _FlatState | None:
        """Gather the state of ``params`` into flat tensors and give ``state`` views of
        them (same values); None where torch's step must run (a parameter without state,
        off the CPU, sparse or complex, or of mixed dtypes)."""
        dtype = params[0].dtype
        for p in params:
            state, grad = self.state.get(p), p.grad
            if (not state or not p.is_cpu or p.is_complex() or p.dtype != dtype
                    or grad is None or grad.is_sparse or grad.dtype != dtype
                    or state["square_avg"].dtype != dtype or state["step"].numel() != 1):
                return None  # torch's step makes the state (or refuses)
        states = [self.state[p] for p in params]
        square_avg = torch.cat([s["square_avg"].reshape(-1) for s in states])
        steps = torch.stack([s["step"].reshape(()) for s in states])

        def views(flat: Tensor) -> tuple[Tensor, ...]:
            return tuple(flat_views(flat, params))

        grad, avg = torch.empty_like(square_avg), torch.empty_like(square_avg)
        flat = _FlatState(params, self.state, tuple(states), square_avg, steps,
                          views(square_avg), tuple(steps.unbind()),
                          grad, views(grad), avg, views(avg))
        for state, avg_view, step_view in zip(states, flat.square_avg_views, flat.step_views,
                                              strict=True):
            state["square_avg"], state["step"] = avg_view, step_view
        self._flat = flat
        return flat
