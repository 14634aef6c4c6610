"""A whole off-policy gradient update as one compiled graph: autograd, clipping, Adam, skip.

``torch.compile`` of a loss followed by ``loss.backward()`` and ``optimizer.step()``
breaks the graph at both, so on a CPU the compiled update ran slower than the eager one.
Here the gradient comes from ``torch.func.grad_and_value`` over the module's parameters
(autograd, traced), and the global-norm clip, Adam and the non-finite skip are written
out in the same function, so the whole update compiles with ``fullgraph=True``: one call,
elementwise work fused into a few loops, no autograd engine or optimiser Python per update.

It reads and writes the optimisers' own state (``exp_avg``, ``exp_avg_sq``, ``step``, created
as ``torch.optim.Adam`` creates them) and the learning rate their schedules set, so a
checkpoint taken on this path resumes on the eager one and back. The arithmetic is
``clip_grads_with_norm_`` and ``Adam``'s (the fused kernel's order of operations); the
rounding of fused loops differs from the eager kernels in the last bits
(``tests/learners/test_whole_update.py`` compares the two). A non-finite loss or clipped gradient
norm leaves parameters, moments and step counts as they were and raises the
:class:`~rlloop.learners.optim_step.GuardedStep`'s flag, on the device, as the eager path does.
One difference: a parameter the loss never reaches gets a zero gradient here, where the
eager step skips it, so its Adam step count advances (its moments stay zero, so it does
not move); an optimiser none of whose parameters an update reaches is left out of it
instead (``idle``, TD3's actor between delayed updates).
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad_and_value

from rlloop.learners.gradients import clip_scale, total_norm
from rlloop.learners.optim_step import GuardedStep

#: ``loss_fn(module, *inputs) -> (loss, aux)``: the module's parameters are the ones being
#: differentiated while it runs; ``aux`` holds detached tensors.
LossFn = Callable[..., tuple[Tensor, Any]]


class _Bound(nn.Module):
    """``loss_fn`` on ``module`` as a module's forward pass, for ``functional_call``."""

    def __init__(self, module: nn.Module, loss_fn: LossFn) -> None:
        super().__init__()
        self.module, self.loss_fn = module, loss_fn

    def forward(self, *inputs: Any) -> tuple[Tensor, Any]:
        return self.loss_fn(self.module, *inputs)


def _plain_adam(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer`` is a fused Adam (its step count on the parameters' device)
    whose update :class:`WholeUpdate` writes out."""
    if not isinstance(optimizer, torch.optim.Adam) or len(optimizer.param_groups) != 1:
        return False
    g = optimizer.param_groups[0]
    return (bool(g["fused"]) and not g["amsgrad"] and not g["maximize"] and not g["differentiable"]
            and g["weight_decay"] == 0 and not isinstance(g["lr"], Tensor)
            and not isinstance(g["betas"][0], Tensor))


class WholeUpdate:
    """One update of ``module``'s parameters by ``step``'s optimisers, compiled whole.

    Args:
        module: Owns every parameter the optimisers step (and nothing they do not).
        loss_fn: The loss, as in :data:`LossFn`.
        step: The learner's guard; its optimisers must each be a plain Adam (see
            :meth:`unsupported`), its flag and skip count are written as the eager path does.
        backend: ``torch.compile``'s backend (tests trace with ``"eager"``, which skips
            code generation).
    """

    #: Learning rates copied in before each call, not training state.
    transient_attrs = frozenset({"lrs"})

    def __init__(self, module: nn.Module, loss_fn: LossFn, step: GuardedStep,
                 backend: str = "inductor") -> None:
        self.module, self.step = module, step
        self.bound = _Bound(module, loss_fn)
        trainable = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        self.names = [f"module.{n}" for n, _ in trainable]
        self.params = [p for _, p in trainable]
        index = {id(p): i for i, (_, p) in enumerate(trainable)}
        self.groups = [[index[id(p)] for p in o.params] for o in step.optims]
        #: ``(beta1, beta2, eps, max_grad_norm)`` per optimiser, read once: the compiled
        #: graph must not read ``param_groups``, whose learning rate schedules move.
        self.hparams = [(*o.optimizer.param_groups[0]["betas"],
                         o.optimizer.param_groups[0]["eps"], o.max_grad_norm)
                        for o in step.optims]
        device = next(module.parameters()).device
        self.lrs = [torch.zeros((), device=device) for _ in step.optims]
        self._fn = torch.compile(_own_code(self._update), fullgraph=True, dynamic=False,
                                 backend=backend)

    def stale(self) -> bool:
        """Whether a parameter was frozen since this was built (the graph would still step
        it): the caller builds anew or falls back. (One unfrozen later is in no optimiser,
        so neither path steps it.)"""
        return not all(p.requires_grad for p in self.params)

    @staticmethod
    def unsupported(module: nn.Module, step: GuardedStep) -> str | None:
        """What keeps the update of ``module`` by ``step`` from compiling whole, or None:
        the optimisers must be fused plain Adams that split ``module``'s trainable
        parameters between them (each once), and no hook may sit on the module."""
        trainable = {id(p) for p in module.parameters() if p.requires_grad}
        stepped = [id(p) for o in step.optims for p in o.params]
        if not step.optims or not all(_plain_adam(o.optimizer) for o in step.optims):
            return "an optimiser is not a fused Adam without weight decay or amsgrad"
        if len(stepped) != len(trainable) or set(stepped) != trainable:
            return "the optimisers do not step exactly the module's trainable parameters"
        if _hooked(module):
            return "a hook sits on the network"
        return None

    def __call__(self, *inputs: Any, idle: nn.Module | None = None) -> Any:
        """Run one update on ``inputs`` (passed to ``loss_fn``); returns ``aux``.

        ``idle``, a part of the module this loss does not reach (TD3's actor between its
        delayed updates): the optimisers of its parameters alone are left as they are, as
        the eager step leaves an optimiser whose parameters got no gradient. Each set of
        idle optimisers is a graph of its own.
        """
        spared = set() if idle is None else {id(p) for p in idle.parameters()}
        active = tuple(not all(id(p) in spared for p in o.params) for o in self.step.optims)
        # An inactive optimiser's state is neither read nor created (as the eager step
        # creates none before an optimiser first steps).
        state: list[Any] = [()] * len(self.params)
        for o, group, lr, on in zip(self.step.optims, self.groups, self.lrs, active,
                                    strict=True):
            lr.fill_(o.optimizer.param_groups[0]["lr"])
            for i, p in zip(group, o.params, strict=True):
                if on:
                    state[i] = _adam_state(o.optimizer, p)
        assert self.step.flag is not None and self.step.skipped is not None
        with torch.no_grad():
            return self._fn([p.detach() for p in self.params], state, self.lrs,
                            self.step.flag, self.step.skipped, active, *inputs)

    def _loss(self, params: list[Tensor], *inputs: Any) -> tuple[Tensor, Any]:
        named = dict(zip(self.names, params, strict=True))
        return functional_call(self.bound, named, inputs)  # type: ignore[no-any-return]

    def _update(self, params: list[Tensor], state: list[tuple[Tensor, Tensor, Tensor]],
                lrs: list[Tensor], flag: Tensor, skipped: Tensor, active: tuple[bool, ...],
                *inputs: Any) -> Any:
        grads, (loss, aux) = grad_and_value(self._loss, has_aux=True)(params, *inputs)
        finite = torch.isfinite(loss)
        scales: list[Tensor | None] = []
        for (*_, max_norm), group, on in zip(self.hparams, self.groups, active, strict=True):
            scales.append(None)
            if on and max_norm is not None:
                norm = total_norm([grads[i] for i in group])
                scales[-1] = clip_scale(max_norm, norm)
                finite = finite & torch.isfinite(norm)
        for (beta1, beta2, eps, _), group, lr, scale, on in zip(
                self.hparams, self.groups, lrs, scales, active, strict=True):
            for i in group if on else ():
                _adam(params[i], grads[i] if scale is None else grads[i] * scale, *state[i],
                      lr, beta1, beta2, eps, finite)
        flag.copy_(~finite)
        skipped.add_(flag)
        return aux


def _own_code(method: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` (bound) on a copy of its code object. ``torch.compile`` keeps a bounded
    number of compiled versions per code object, and each :class:`WholeUpdate` bakes its
    shapes and settings into its graph: with a code object of its own, every instance
    has the whole budget (a sweep building many learners in one process would otherwise
    run out of it, a hard error under ``fullgraph``), and a dropped instance frees its
    graphs with its code."""
    fn = method.__func__  # type: ignore[attr-defined]
    copy = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__,
                              fn.__defaults__, fn.__closure__)
    return types.MethodType(copy, method.__self__)  # type: ignore[attr-defined]


def _hooked(module: nn.Module) -> bool:
    """Whether a hook runs around ``module`` or a submodule (or around every module)."""
    hooks = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
    everywhere = ("_global_forward_hooks", "_global_forward_pre_hooks",
                  "_global_backward_hooks", "_global_backward_pre_hooks")
    return (any(getattr(nn.modules.module, name, None) for name in everywhere)
            or any(getattr(m, name, None) for m in module.modules() for name in hooks))


def _adam_state(optimizer: torch.optim.Optimizer, p: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``(exp_avg, exp_avg_sq, step)`` of ``p``, created as ``Adam`` creates them."""
    state = optimizer.state[p]
    if not state:
        state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
        state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
    return state["exp_avg"], state["exp_avg_sq"], state["step"]


def _adam(p: Tensor, g: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor, step: Tensor,
          lr: Tensor, beta1: float, beta2: float, eps: float, finite: Tensor) -> None:
    """Adam's step of ``p`` in place (the fused kernel's arithmetic), none where not
    ``finite``."""
    new_step = step + 1
    m = exp_avg + (g - exp_avg) * (1 - beta1)
    v = exp_avg_sq * beta2 + g * g * (1 - beta2)
    bias1 = 1 - beta1 ** new_step
    bias2_sqrt = (1 - beta2 ** new_step).sqrt()
    denom = v.sqrt() / bias2_sqrt + eps
    new_p = p - (lr / bias1) * m / denom
    step.copy_(torch.where(finite, new_step, step))
    exp_avg.copy_(torch.where(finite, m, exp_avg))
    exp_avg_sq.copy_(torch.where(finite, v, exp_avg_sq))
    p.copy_(torch.where(finite, new_p, p))
