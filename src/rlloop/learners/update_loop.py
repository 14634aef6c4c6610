"""Many of DQN's hand-derived updates in one call, run by TorchScript's interpreter.

An optimisation step of DQN on CartPole makes 128 updates of a 64-row batch through a
``[256, 256]`` MLP. Eager, each update is about 40 small ops, and on a CPU the Python that
issues an op (argument parsing, tensor wrappers, the interpreter) costs about as much as
the op itself. While the target network stays fixed, every batch and TD target of those
updates is known before the first one runs (``DQN._optimize_uniform``), so the whole run of
them can be one call: :func:`_dqn_updates`, compiled by ``torch.jit.script`` and run by
TorchScript's C++ interpreter, leaves Python out of the loop. No C++ compiler is involved
(it is not ``torch.compile``), and compiling takes milliseconds.

It issues the ops of the eager path, in its order, on the same tensors:
:class:`~rlloop.learners.mlp_backprop.DQNBackprop`'s forward, Huber gradient and backward,
:class:`~rlloop.learners.optim_step.GuardedStep`'s clip and skip flag, and
:class:`~rlloop.learners.adam.Adam`'s fused step on its flat buffers. Parameters, Adam's
moments, step counts and skip counts are the same to the bit as update by update
(``tests/learners/test_update_loop.py``), so the checkpoints and exact resume are unchanged.

It runs only where that path would run: the hand-derived backward, one flat Adam whose
skip flag is the guard's, no importance weights, the guard not raising (which would read
the flag after every update). ``torch.jit.script`` is deprecated in recent torch; where it is
gone or fails, :func:`scripted_updates` returns None (after one warning saying so) and the
updates run one by one, eager.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from rlloop.learners.adam import FlatAdamStep


def _dqn_updates(obs: Tensor, actions: Tensor, targets: Tensor, weights: list[Tensor],
                 biases: list[Tensor], weight_grads: list[Tensor], bias_grads: list[Tensor],
                 flat_data: list[Tensor], flat_grad: list[Tensor], exp_avg: list[Tensor],
                 exp_avg_sq: list[Tensor], one_step: list[Tensor], steps: Tensor, flag: Tensor,
                 skipped: Tensor, max_grad_norm: float, lr: float, beta1: float, beta2: float,
                 weight_decay: float, eps: float, maximize: bool) -> tuple[Tensor, Tensor]:
    """``k`` updates: ``obs [k, B, in]``, ``actions [k, B, 1]`` (int64), ``targets [k, B]``;
    ``max_grad_norm < 0`` clips nothing. Returns the last update's ``Q(s, a)`` and TD errors.

    Adam's buffers come in one-element lists made by the caller: the script's dead-code
    pass drops a ``_fused_adam_`` whose lists are built inside the function."""
    last = len(weights) - 1
    grads = flat_grad[0]
    q = targets[0]
    td_errors = targets[0]
    for i in range(obs.shape[0]):
        # MLPBackprop.forward
        x = obs[i]
        inputs: list[Tensor] = []
        for j in range(last + 1):
            inputs.append(x)
            x = torch.addmm(biases[j], x, weights[j].t())
            if j < last:
                x = x.relu_()
        # dqn_loss_grad (no importance weights)
        index = actions[i]
        q = x.gather(1, index).squeeze(1)
        td_errors = targets[i] - q
        g = td_errors.neg().clamp_(-1.0, 1.0).div_(q.shape[0])
        grad = torch.zeros_like(x).scatter_(1, index, g.unsqueeze(1))
        # MLPBackprop.backward
        for j in range(last, -1, -1):
            torch.mm(grad.t(), inputs[j], out=weight_grads[j])
            torch.sum(grad, 0, out=bias_grads[j])
            if j > 0:
                grad = torch.ops.aten.threshold_backward(grad.mm(weights[j]), inputs[j], 0.0)
        # GuardedStep.apply with the TD errors' sum (clip_scale: float / tensor is
        # reciprocal times the float, as Python's operator computes it)
        finite = td_errors.sum()
        if max_grad_norm >= 0.0:
            norm = torch.linalg.vector_norm(grads)
            grads.mul_(torch.clamp((norm + 1e-6).reciprocal() * max_grad_norm, max=1.0))
            finite = finite + norm
        torch.sub(finite, finite, out=flag)
        flag.ne_(0.0)
        skipped.add_(flag)
        # Adam's flat step
        steps.add_(1)
        torch._fused_adam_(flat_data, flat_grad, exp_avg, exp_avg_sq, [], one_step, lr=lr,
                           beta1=beta1, beta2=beta2, weight_decay=weight_decay, eps=eps,
                           amsgrad=False, maximize=maximize, grad_scale=None, found_inf=flag)
        steps.sub_(flag)
    return q, td_errors


@functools.cache
def _scripted() -> Callable[..., tuple[Tensor, Tensor]] | None:
    """:func:`_dqn_updates` through ``torch.jit.script``, once per process; None where
    this torch cannot script it."""
    try:
        with warnings.catch_warnings():
            # Deprecated in favour of torch.compile, which needs a C++ compiler and tens
            # of seconds; the eager loop stands in wherever scripting goes away.
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", FutureWarning)
            return torch.jit.script(_dqn_updates)  # type: ignore[no-any-return]
    except Exception as e:  # any failure to script means: run eager
        warnings.warn(f"torch.jit.script could not compile DQN's update loop "
                      f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
                      "DQN's updates run one by one, eager (slower, the same results)",
                      stacklevel=2)
        return None


def scripted_updates(weights: list[Tensor], biases: list[Tensor], adam: FlatAdamStep,
                     flag: Tensor, skipped: Tensor, max_grad_norm: float | None
                     ) -> Callable[[Tensor, Tensor, Tensor], tuple[Tensor, Tensor]] | None:
    """``run(obs [k, B, in], actions [k, B, 1], targets [k, B]) -> (q, td_errors)`` of the
    last update, making ``k`` updates of the MLP ``weights``/``biases`` (``nn.Linear``'s,
    whose ``.grad`` are views of ``adam.flat.grad``), or None where it cannot run."""
    scripted = _scripted()
    if (scripted is None or adam.found_inf is not flag or adam.grad_scale is not None
            or any(p.grad is None for p in [*weights, *biases])):
        return None
    weight_grads = [w.grad for w in weights]
    bias_grads = [b.grad for b in biases]
    args: tuple[Any, ...] = (
        weights, biases, weight_grads, bias_grads, [adam.flat.data], [adam.flat.grad],
        [adam.exp_avg], [adam.exp_avg_sq], [adam.one_step], adam.steps, flag, skipped,
        -1.0 if max_grad_norm is None else float(max_grad_norm), float(adam.lr),
        float(adam.beta1), float(adam.beta2), float(adam.weight_decay), float(adam.eps),
        bool(adam.maximize))

    def run(obs: Tensor, actions: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
        with torch.no_grad():
            return scripted(obs, actions, targets, *args)

    return run
