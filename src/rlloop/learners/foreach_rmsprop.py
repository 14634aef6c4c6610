"""RMSprop whose plain step on a CPU calls torch's foreach update directly.

A2C takes one optimiser step per rollout of a few dozen env steps, so the step's Python is
a visible share of its iteration: torch's ``RMSprop.step`` sorts the tensors into device
groups, checks its options and wraps its functional form around the six foreach ops that
do the update, about 60 µs a step for a [64, 64] actor-critic on a CPU. In the setting
rl-zoo and Stable-Baselines3 run A2C in (one parameter group on the CPU, ``foreach=True``,
no momentum, centring, weight decay or ``maximize``, a float learning rate, every state
made by a first step of torch's) :class:`ForeachRMSprop` runs those six ops itself, in
torch's order on the same tensors, so parameters and state are bit-identical
(``tests/learners/test_foreach_rmsprop.py``). Any other setting, a closure or a compiled
graph takes torch's step; step hooks run around either (the wrapper ``Optimizer`` puts on
every optimiser class's ``step``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from rlloop.learners.adam import RMSprop


class ForeachRMSprop(RMSprop):
    """:class:`~rlloop.learners.adam.RMSprop` (same arguments, state and results) with the
    direct step the module docstring describes."""

    def step(self, closure: Callable[[], float] | None = None) -> Any:  # type: ignore[override]
        tensors = None if closure is not None else self._plain_step_tensors()
        if tensors is None:
            return super().step(closure)
        params, grads, square_avgs, steps = tensors
        group = self.param_groups[0]
        alpha, eps, lr = group["alpha"], group["eps"], group["lr"]
        with torch.no_grad():
            # torch's _multi_tensor_rmsprop for CPU step counts, op for op.
            torch._foreach_add_(steps, torch.tensor(1.0, device="cpu"), alpha=1.0)
            torch._foreach_mul_(square_avgs, alpha)
            torch._foreach_addcmul_(square_avgs, grads, grads, value=1 - alpha)
            avg = torch._foreach_sqrt(square_avgs)
            torch._foreach_add_(avg, eps)
            torch._foreach_addcdiv_(params, grads, avg, value=-lr)
        return None

    def _plain_step_tensors(
        self,
    ) -> tuple[list[Tensor], list[Tensor], list[Tensor], list[Tensor]] | None:
        """The parameters with a gradient, their gradients, square averages and step
        counts, where this step may run directly; else None."""
        if len(self.param_groups) != 1 or torch.compiler.is_compiling():
            return None
        group = self.param_groups[0]
        if not (group["foreach"] and group["momentum"] == 0 and not group["centered"]
                and group["weight_decay"] == 0 and not group["maximize"]
                and not group["differentiable"] and not group["capturable"]
                and isinstance(group["lr"], float)):
            return None
        params, grads, square_avgs, steps = [], [], [], []
        for p in group["params"]:
            grad = p.grad
            if grad is None:
                continue
            state = self.state.get(p)
            if not state or not p.is_cpu or grad.is_sparse or p.is_complex():
                return None  # torch's step makes the state (or refuses)
            params.append(p)
            grads.append(grad)
            square_avgs.append(state["square_avg"])
            steps.append(state["step"])
        return (params, grads, square_avgs, steps) if params else None
