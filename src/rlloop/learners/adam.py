"""``Adam`` and ``RMSprop``: torch's optimisers that do not import ``torch._dynamo`` while it
is unused.

Every ``torch.optim.Optimizer`` method is wrapped to keep ``torch.compile`` from tracing
into it, and the wrappers import ``torch._dynamo`` on their first call: about a second,
more than the default CartPole run spends training. Nothing can be compiling while
``torch._dynamo`` has not been imported (``torch.compile`` imports it), so until then these
methods call the functions torch wrapped, with the same grad mode; once it is imported
they take torch's own path.

``Optimizer`` also wraps every optimiser class's ``step`` in its step hooks, inside a
profiler label (``record_function``) that costs ~40 µs a call even with no profiler
running: an off-policy learner pays it on every update (2-3% of a DQN update here), as
A2C does every few env steps. Ours
runs that wrapper only while a step hook is registered (the optimiser's own or a global
one), so hooks run as before, and ``zero_grad()`` sets the gradients to None without
its label; the trace of ``rlloop train --profile`` labels the learner's phases itself.
The update is torch's own either way.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable
from typing import Any, ClassVar

import torch
import torch.optim.optimizer as torch_optimizer

_DYNAMO = "torch._dynamo"


def _unwrapped(method: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` without torch's wrappers (``functools.wraps`` records what they wrap)."""
    return inspect.unwrap(method)


def _without_profile_hook(method: Callable[..., Any]) -> Callable[..., Any]:
    """``Adam.step`` as torch wraps it for dynamo, without the step-hook wrapper that
    ``Optimizer`` puts on its class at the first construction (ours gets its own)."""
    return inspect.unwrap(method, stop=lambda f: not getattr(f, "hooked", False))


def _step_hooks(optimizer: torch.optim.Optimizer) -> bool:
    """Whether a step hook would run around ``optimizer.step()`` (its own or a global one);
    True where this torch keeps its hooks elsewhere, so that they run."""
    hooks = [getattr(torch_optimizer, "_global_optimizer_pre_hooks", None),
             getattr(torch_optimizer, "_global_optimizer_post_hooks", None),
             getattr(optimizer, "_optimizer_step_pre_hooks", None),
             getattr(optimizer, "_optimizer_step_post_hooks", None)]
    return any(h is None or len(h) > 0 for h in hooks)


class _Eager(torch.optim.Optimizer):
    """A torch optimiser class (``torch_cls``: same arguments, state and results) minus the
    import of ``torch._dynamo`` in eager use and the profiler label around each step; see
    the module docstring."""

    torch_cls: ClassVar[type[torch.optim.Optimizer]]

    @staticmethod
    def profile_hook_step(func: Callable[..., Any]) -> Callable[..., Any]:
        """torch's wrapper around ``step`` (hooks inside a profiler label) while a step
        hook is registered, else ``func`` alone."""
        hooked = torch.optim.Optimizer.profile_hook_step(func)

        @functools.wraps(func)
        def step(*args: Any, **kwargs: Any) -> Any:
            return (hooked if _step_hooks(args[0]) else func)(*args, **kwargs)

        return step

    def step(self, closure: Callable[[], float] | None = None) -> Any:  # type: ignore[override]
        if _DYNAMO in sys.modules:
            return _without_profile_hook(self.torch_cls.step)(self, closure)
        # What torch's wrapper does around the update, minus its graph breaks.
        with torch.set_grad_enabled(self.defaults["differentiable"]):
            return _unwrapped(self.torch_cls.step)(self, closure)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        if _DYNAMO in sys.modules:
            super().add_param_group(param_group)
        else:
            _unwrapped(self.torch_cls.add_param_group)(self, param_group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        if set_to_none:  # what torch's does, minus its profiler label (as for ``step``)
            for group in self.param_groups:
                for p in group["params"]:
                    p.grad = None
            return
        if _DYNAMO in sys.modules:
            super().zero_grad(set_to_none)
        else:
            _unwrapped(self.torch_cls.zero_grad)(self, set_to_none)

    def state_dict(self) -> dict[str, Any]:
        if _DYNAMO in sys.modules:
            return super().state_dict()
        return _unwrapped(self.torch_cls.state_dict)(self)  # type: ignore[no-any-return]

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if _DYNAMO in sys.modules:
            super().load_state_dict(state_dict)
        else:
            _unwrapped(self.torch_cls.load_state_dict)(self, state_dict)


class Adam(_Eager, torch.optim.Adam):
    """``torch.optim.Adam`` without ``torch._dynamo``'s import in eager use.

    With ``fused=True`` on a CPU, once every parameter has its state, ``step()`` calls the
    fused kernel itself, with the arguments and state torch's step would pass it: the same
    parameters and moments to the bit (``tests/learners/test_adam.py``), without the ~45 µs
    of Python torch's step spends gathering them (a DQN update on CartPole is ~0.8 ms).
    Anything else (a closure, several groups, a parameter without a gradient or state,
    AMSGrad, a tensor learning rate, another device) takes torch's step.
    """

    torch_cls = torch.optim.Adam

    def step(self, closure: Callable[[], float] | None = None) -> Any:  # type: ignore[override]
        if closure is None and not torch.compiler.is_compiling() and self._fused_cpu_step():
            return None
        return super().step(closure)

    def _fused_cpu_step(self) -> bool:
        """torch's fused Adam step, written out for one group of CPU parameters that all
        have gradients and state; False, having done nothing, where it does not apply."""
        if len(self.param_groups) != 1:
            return False
        group = self.param_groups[0]
        beta1, beta2 = group["betas"]
        if (not group["fused"] or group["amsgrad"] or group["differentiable"]
                or group["capturable"] or group["decoupled_weight_decay"]
                or not isinstance(group["lr"], float) or not isinstance(beta1, float)
                or not isinstance(beta2, float)):
            return False
        params: list[torch.Tensor] = group["params"]
        grads, exp_avgs, exp_avg_sqs, steps = [], [], [], []
        dtype = params[0].dtype
        for p in params:
            grad, state = p.grad, self.state.get(p)
            if (grad is None or not state or p.dtype != dtype or p.device.type != "cpu"
                    or grad.is_sparse):
                return False
            grads.append(grad)
            exp_avgs.append(state["exp_avg"])
            exp_avg_sqs.append(state["exp_avg_sq"])
            steps.append(state["step"])
        found_inf = getattr(self, "found_inf", None)
        with torch.no_grad():
            torch._foreach_add_(steps, 1)
            torch._fused_adam_(params, grads, exp_avgs, exp_avg_sqs, [], steps, amsgrad=False,
                               lr=group["lr"], beta1=beta1, beta2=beta2,
                               weight_decay=group["weight_decay"], eps=group["eps"],
                               maximize=group["maximize"],
                               grad_scale=getattr(self, "grad_scale", None),
                               found_inf=found_inf)
            if found_inf is not None:  # a skipped step leaves the step counts as they were
                torch._foreach_sub_(steps, [found_inf] * len(steps))
        return True


class RMSprop(_Eager, torch.optim.RMSprop):
    """``torch.optim.RMSprop`` without ``torch._dynamo``'s import in eager use."""

    torch_cls = torch.optim.RMSprop
