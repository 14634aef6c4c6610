"""``Adam``: ``torch.optim.Adam`` that does not import ``torch._dynamo`` while it is unused.

Every ``torch.optim.Optimizer`` method is wrapped to keep ``torch.compile`` from tracing
into it, and the wrappers import ``torch._dynamo`` on their first call: about a second,
more than the default CartPole run spends training. Nothing can be compiling while
``torch._dynamo`` has not been imported (``torch.compile`` imports it), so until then these
methods call the functions torch wrapped, with the same grad mode; once it is imported
they take torch's own path. The update is torch's own Adam either way.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch.optim.adam import adam as torch_functional_adam

_DYNAMO = "torch._dynamo"


def _unwrapped(method: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` without torch's wrappers (``functools.wraps`` records what they wrap)."""
    return inspect.unwrap(method)


def _without_profile_hook(method: Callable[..., Any]) -> Callable[..., Any]:
    """``Adam.step`` as torch wraps it for dynamo, without the step-hook wrapper that
    ``Optimizer`` puts on its class at the first construction (ours gets its own)."""
    return inspect.unwrap(method, stop=lambda f: not getattr(f, "hooked", False))


class Adam(torch.optim.Adam):
    """``torch.optim.Adam`` (same arguments, state and results) minus the import of
    ``torch._dynamo`` in eager use; see the module docstring."""

    def step(self, closure: Callable[[], float] | None = None) -> Any:  # type: ignore[override]
        if _DYNAMO in sys.modules:
            return _without_profile_hook(torch.optim.Adam.step)(self, closure)
        # What torch's wrapper does around the update, minus its graph breaks.
        with torch.set_grad_enabled(self.defaults["differentiable"]):
            return _unwrapped(torch.optim.Adam.step)(self, closure)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        if _DYNAMO in sys.modules:
            super().add_param_group(param_group)
        else:
            _unwrapped(torch.optim.Adam.add_param_group)(self, param_group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        if _DYNAMO in sys.modules:
            super().zero_grad(set_to_none)
        else:
            _unwrapped(torch.optim.Adam.zero_grad)(self, set_to_none)

    def state_dict(self) -> dict[str, Any]:
        if _DYNAMO in sys.modules:
            return super().state_dict()
        return _unwrapped(torch.optim.Adam.state_dict)(self)  # type: ignore[no-any-return]

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if _DYNAMO in sys.modules:
            super().load_state_dict(state_dict)
        else:
            _unwrapped(torch.optim.Adam.load_state_dict)(self, state_dict)



#: torch's functional Adam without its dynamo wrapper (the class above has the reason).
_functional_adam = _unwrapped(torch_functional_adam)
_Lists = tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor], list[torch.Tensor],
               list[torch.Tensor], list[torch.Tensor]]


def step_fused(optimizers: list[torch.optim.Optimizer], found_inf: torch.Tensor
               ) -> list[torch.optim.Optimizer]:
    """``step()`` of every fused :class:`Adam` in ``optimizers`` through torch's functional
    ``adam`` (what ``Adam.step`` calls), one call for all groups with the same settings.

    ``Adam.step`` spends longer in Python (grouping, state checks) than its fused kernel
    takes on a small network's parameters; this builds the kernel's argument lists
    straight from the optimisers' state. Same kernel and arguments, so the same results,
    state and ``state_dict`` (``tests/test_optim_step.py``); ``found_inf`` skips the step
    as ``Adam.step`` does with it.

    Returns the optimisers left for ``step()``: any other optimiser, a group whose
    parameters do not all have a gradient (``step()`` skips those: TD3's actor between
    delayed updates) or state yet (``step()`` creates it), and every one once
    ``torch._dynamo`` is imported (a compiled update traces torch's own ``step``).
    """
    if _DYNAMO in sys.modules:
        return optimizers
    rest: list[torch.optim.Optimizer] = []
    calls: dict[tuple[Any, ...], _Lists] = {}
    for opt in optimizers:
        groups = _kernel_lists(opt) if type(opt) is Adam else None
        if groups is None:
            rest.append(opt)
            continue
        for key, lists in groups:
            if key not in calls:
                calls[key] = ([], [], [], [], [], [])
            for acc, more in zip(calls[key], lists, strict=True):
                acc.extend(more)
    with torch.no_grad():
        for (lr, (beta1, beta2), eps, decay, amsgrad, maximize, decoupled), lists in \
                calls.items():
            _functional_adam(*lists, fused=True, found_inf=found_inf, amsgrad=amsgrad,
                             beta1=beta1, beta2=beta2, lr=lr, weight_decay=decay, eps=eps,
                             maximize=maximize, decoupled_weight_decay=decoupled)
    return rest


def _kernel_lists(opt: torch.optim.Optimizer) -> list[tuple[tuple[Any, ...], _Lists]] | None:
    """Each group's settings and fused-kernel argument lists, or None where ``opt.step()``
    must run instead (see :func:`step_fused`)."""
    out = []
    state = opt.state
    for group in opt.param_groups:
        if (not group.get("fused") or group["differentiable"] or group["capturable"]
                or isinstance(group["lr"], torch.Tensor)):
            return None
        amsgrad = group["amsgrad"]
        lists: _Lists = (list(group["params"]), [], [], [], [], [])
        _, grads, avgs, sqs, maxs, steps = lists
        for p in lists[0]:
            s = state.get(p)
            if p.grad is None or not s:
                return None
            grads.append(p.grad)
            avgs.append(s["exp_avg"])
            sqs.append(s["exp_avg_sq"])
            steps.append(s["step"])
            if amsgrad:
                maxs.append(s["max_exp_avg_sq"])
        key = (group["lr"], tuple(group["betas"]), group["eps"], group["weight_decay"], amsgrad,
               group["maximize"], group.get("decoupled_weight_decay", False))
        out.append((key, lists))
    return out
