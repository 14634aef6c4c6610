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
from dataclasses import dataclass
from typing import Any, ClassVar, cast

import torch
import torch.optim.optimizer as torch_optimizer

from rlloop.learners.flat_buffers import FlatParameters

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
    AMSGrad, a tensor learning rate, another device) takes torch's step. With
    :meth:`use_flat`, the moments live in flat buffers too and the call is one kernel over
    all of them.
    """

    torch_cls = torch.optim.Adam

    #: The flat layout of :meth:`use_flat` (None: one tensor per parameter, as torch's).
    flat: FlatParameters | None = None

    def step(self, closure: Callable[[], float] | None = None) -> Any:  # type: ignore[override]
        if closure is None and not torch.compiler.is_compiling() and self._flat_step():
            return None
        if self.flat is not None:  # a per-tensor step may advance some counts, not all
            self._steps_agree = False
        if closure is None and not torch.compiler.is_compiling() and self._fused_cpu_step():
            return None
        return super().step(closure)

    def use_flat(self, flat: FlatParameters) -> None:
        """Keep the moments and step counts of ``flat``'s parameters (this optimiser's only
        group, in the same order) in flat buffers as well, so that a step is one fused-kernel
        call over the whole of them (:mod:`rlloop.learners.flat_buffers`).

        ``state`` keeps torch's form, one entry per parameter, whose tensors are views of
        the buffers; a loaded state is copied into them (a ``load_state_dict`` post-hook).
        Each element takes the arithmetic of torch's step, so the results are the same to
        the bit. A step where the layout does not hold (a parameter's gradient rebound,
        step counts that differ after a load) takes the per-tensor path instead.
        """
        params = self.param_groups[0]["params"]
        if len(self.param_groups) != 1 or len(params) != len(flat.params) or any(
                p is not q for p, q in zip(params, flat.params, strict=True)):
            raise ValueError("use_flat takes the optimiser's own parameters, in order")
        self.flat = flat
        self._exp_avg = torch.zeros_like(flat.data)
        self._exp_avg_sq = torch.zeros_like(flat.data)
        # fused Adam keeps its step counts as float32 tensors on the parameters' device
        self._steps = torch.zeros(len(params), dtype=torch.float32, device=flat.data.device)
        self._lay_out_state()
        self.register_load_state_dict_post_hook(_lay_out_loaded_state)

    def _lay_out_state(self) -> None:
        """Copy each parameter's state (zeros where it has none yet, as torch's first step
        would make it) into the flat buffers and make the entries views of them."""
        flat = self.flat
        assert flat is not None
        avgs, avg_sqs = flat.views(self._exp_avg), flat.views(self._exp_avg_sq)
        with torch.no_grad():
            for i, p in enumerate(flat.params):
                state = self.state[p]
                if state:
                    avgs[i].copy_(state["exp_avg"])
                    avg_sqs[i].copy_(state["exp_avg_sq"])
                    self._steps[i].copy_(state["step"])
                else:
                    avgs[i].zero_()
                    avg_sqs[i].zero_()
                    self._steps[i].zero_()
                state.update(step=self._steps[i], exp_avg=avgs[i], exp_avg_sq=avg_sqs[i])
        self._one_step = self._steps[0]
        self._steps_agree = bool((self._steps == self._steps[0]).all())

    def flat_step(self) -> FlatAdamStep | None:
        """What the fused step over the flat buffers of :meth:`use_flat` reads and writes,
        or None where they do not hold (this step then takes the per-tensor path)."""
        flat = self.flat
        if flat is None or not flat.intact():
            return None
        if not self._steps_agree:  # (a host read, only after a per-tensor step)
            self._steps_agree = bool((self._steps == self._steps[0]).all())
            if not self._steps_agree:
                return None
        group = self.param_groups[0]
        if not _fusable(group):
            return None
        beta1, beta2 = group["betas"]
        return FlatAdamStep(flat, self._exp_avg, self._exp_avg_sq, self._steps,
                            self._one_step, group["lr"], beta1, beta2, group["weight_decay"],
                            group["eps"], group["maximize"],
                            getattr(self, "grad_scale", None), getattr(self, "found_inf", None))

    def _flat_step(self) -> bool:
        """The fused step over the flat buffers of :meth:`use_flat`; False, having done
        nothing, where they do not hold."""
        step = self.flat_step()
        if step is None:
            return False
        found_inf = step.found_inf
        with torch.no_grad():
            step.steps.add_(1)
            torch._fused_adam_([step.flat.data], [step.flat.grad], [step.exp_avg],
                               [step.exp_avg_sq], [], [step.one_step], amsgrad=False,
                               lr=step.lr, beta1=step.beta1, beta2=step.beta2,
                               weight_decay=step.weight_decay, eps=step.eps,
                               maximize=step.maximize, grad_scale=step.grad_scale,
                               found_inf=found_inf)
            if found_inf is not None:  # a skipped step leaves the step counts as they were
                step.steps.sub_(found_inf)
        return True

    def _fused_cpu_step(self) -> bool:
        """torch's fused Adam step, written out for one group of CPU parameters that all
        have gradients and state; False, having done nothing, where it does not apply."""
        if len(self.param_groups) != 1:
            return False
        group = self.param_groups[0]
        if not _fusable(group):
            return False
        beta1, beta2 = group["betas"]
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


@dataclass(frozen=True)
class FlatAdamStep:
    """The tensors and settings of one fused Adam step over a flat layout
    (:meth:`Adam.flat_step`): the step counts ``steps`` (one per parameter, all equal) are
    advanced around the kernel, which reads ``one_step`` (the first of them)."""

    flat: FlatParameters
    exp_avg: torch.Tensor
    exp_avg_sq: torch.Tensor
    steps: torch.Tensor
    one_step: torch.Tensor
    lr: float
    beta1: float
    beta2: float
    weight_decay: float
    eps: float
    maximize: bool
    grad_scale: torch.Tensor | None
    found_inf: torch.Tensor | None


def _lay_out_loaded_state(optimizer: torch.optim.Optimizer) -> None:
    """The ``load_state_dict`` post-hook of :meth:`Adam.use_flat`."""
    cast(Adam, optimizer)._lay_out_state()


def _fusable(group: dict[str, Any]) -> bool:
    """Whether a parameter group's settings are those the fused CPU step writes out."""
    beta1, beta2 = group["betas"]
    return bool(group["fused"] and not (
        group["amsgrad"] or group["differentiable"] or group["capturable"]
        or group["decoupled_weight_decay"]) and isinstance(group["lr"], float)
        and isinstance(beta1, float) and isinstance(beta2, float))


class RMSprop(_Eager, torch.optim.RMSprop):
    """``torch.optim.RMSprop`` without ``torch._dynamo``'s import in eager use."""

    torch_cls = torch.optim.RMSprop
