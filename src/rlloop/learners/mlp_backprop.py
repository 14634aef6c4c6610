"""DQN's gradient derived by hand, for plain ReLU Q-networks (DQN's default on a CPU).

Autograd is every algorithm's gradient. DQN's update on CartPole is a 64-row batch
through a ``[256, 256]`` MLP: about a quarter of a millisecond of matmuls on one CPU
thread, and autograd's graph adds a visible share to it. With ``dqn.manual_backward``
(``auto``, the default, takes it on a CPU, without ``compile``, for the networks it
derives; ``true`` asks for it) :class:`DQNBackprop` computes the same gradient without
a graph: :class:`MLPBackprop` keeps each layer's input on the way forward, then writes
``dL/dW = g^T a`` and ``dL/db = sum g`` into each parameter's ``.grad`` and passes
``g <- (g W) * [a > 0]`` down, layer by layer, from :func:`dqn_loss_grad` (Huber's
derivative). The optimiser step is the autograd path's
(:class:`~rlloop.learners.optim_step.GuardedStep`), on flat buffers: since this pass
writes every gradient on every update, the Q-network's parameters, gradients and Adam's
moments each live in one buffer (:mod:`rlloop.learners.flat_buffers`), and the norm, the
clip and Adam's step are one op each instead of one per tensor.

It derives one network only, so :func:`dqn_backprop` checks, when the learner is built,
that the Q-network is exactly that: a non-dueling
:class:`~rlloop.modules.q_networks.QNetwork` whose body is
:class:`~rlloop.modules.q_networks.MLP` of ``nn.Linear`` layers, without hooks or
parametrisations. Any other network (a LayerNorm, a tanh, another head) gets autograd,
after one warning where ``true`` asked for the pass. The gradients equal autograd's up
to float rounding (``tests/learners/test_mlp_backprop.py``).
"""

from __future__ import annotations

import warnings
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils import parametrize

from rlloop.losses.dqn import dqn_stats
from rlloop.modules.encoders import flat_input
from rlloop.modules.q_networks import MLP, QNetwork

#: The hook registries of ``nn.Module`` (attributes, read with a default so that a torch
#: version without one of them passes the check instead of failing it).
_HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks",
               "_backward_pre_hooks")


class MLPBackprop:
    """Forward and backward passes of a plain ReLU :class:`~rlloop.modules.q_networks.MLP`.

    It reads the layers' parameters on every call and owns no tensors, so the module stays
    an ordinary module: copies, ``load_state_dict`` and checkpoints work as before.
    """

    def __init__(self, mlp: MLP) -> None:
        self.layers = cast(list[nn.Linear], list(mlp.layers))

    @torch.no_grad()
    def forward(self, x: Tensor) -> tuple[Tensor, list[Tensor]]:
        """The output ``[B, out]`` and the input of every layer (for :meth:`backward`)."""
        inputs: list[Tensor] = []
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            inputs.append(x)
            x = F.linear(x, layer.weight, layer.bias)
            if i < last:
                x = x.relu_()
        return x, inputs

    @torch.no_grad()
    def backward(self, inputs: list[Tensor], grad_out: Tensor) -> None:
        """Set every parameter's ``.grad`` to ``dL/dparam`` given ``grad_out = dL/d output``
        and the ``inputs`` :meth:`forward` returned (overwrites, never accumulates)."""
        g = grad_out
        for i in range(len(self.layers) - 1, -1, -1):
            w, b, a = self.layers[i].weight, self.layers[i].bias, inputs[i]
            if w.grad is None or b.grad is None:
                w.grad, b.grad = torch.empty_like(w), torch.empty_like(b)
            torch.mm(g.t(), a, out=w.grad)
            torch.sum(g, 0, out=b.grad)
            if i:  # a is the previous layer's ReLU output: its gradient passes where a > 0
                g = torch.ops.aten.threshold_backward(g.mm(w), a, 0.0)


def dqn_loss_grad(
    q_values: Tensor, actions: Tensor, target: Tensor, weights: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """The gradient of :func:`rlloop.losses.dqn.dqn_loss` with respect to ``q_values``.

    Huber's derivative is ``clamp(Q(s, a) - y, -1, 1)``; the mean over the batch divides
    it by ``B`` (times the importance weight); other actions' entries are zero.

    Returns:
        ``(grad [B, A], q [B], td_errors [B])`` with ``q = Q(s, a)`` and
        ``td_errors = y - Q(s, a)``, as ``dqn_loss`` returns them.
    """
    index = actions.long().unsqueeze(1)
    q = q_values.gather(1, index).squeeze(1)
    td_errors = target - q
    g = td_errors.neg().clamp_(-1.0, 1.0)
    if weights is not None:
        g = g.mul_(weights)
    g = g.div_(q.shape[0])
    return torch.zeros_like(q_values).scatter_(1, index, g.unsqueeze(1)), q, td_errors


def huber_loss(td_errors: Tensor, weights: Tensor | None = None) -> Tensor:
    """Mean (importance-weighted) Huber loss of ``[B]`` TD errors: ``dqn_loss``'s value,
    from what :func:`dqn_loss_grad` returns."""
    per_sample = F.smooth_l1_loss(td_errors, torch.zeros_like(td_errors), reduction="none")
    return per_sample.mean() if weights is None else (weights * per_sample).mean()


class DQNBackprop:
    """One DQN update's gradient, set into the Q-network's ``.grad`` by hand."""

    def __init__(self, mlp: MLP) -> None:
        self.mlp = mlp
        self.backprop = MLPBackprop(mlp)

    def __call__(self, obs: Tensor, action: Tensor, target: Tensor, weights: Tensor | None,
                 with_stats: bool = True) -> tuple[dict[str, Tensor], Tensor]:
        """Set the gradient of the Huber loss; returns its stats (``{}`` without
        ``with_stats``) and the TD errors ``[B]``."""
        # As QNetwork's forward takes them: in the weights' dtype, bytes scaled.
        q_values, inputs = self.backprop.forward(flat_input(obs, self.mlp.dtype))
        grad, q, td_errors = dqn_loss_grad(q_values, action, target, weights)
        stats = dqn_stats(huber_loss(td_errors, weights), q, td_errors) if with_stats else {}
        self.backprop.backward(inputs, grad)
        return stats, td_errors


def dqn_backprop(network: nn.Module) -> DQNBackprop | None:
    """:class:`DQNBackprop` for ``network`` if it is exactly what it derives; else None,
    after one warning naming what differs (the caller then uses autograd)."""
    problem = _not_plain_relu(network)
    if problem is None:
        return DQNBackprop(cast(QNetwork, network).net)  # type: ignore[arg-type]
    warnings.warn(f"dqn.manual_backward: {problem}, which the hand-derived backward pass "
                  "does not cover; using autograd", stacklevel=3)
    return None


def plain_relu_q_network(network: nn.Module) -> bool:
    """Whether :class:`DQNBackprop` derives ``network``'s gradient exactly."""
    return _not_plain_relu(network) is None


def _not_plain_relu(network: nn.Module) -> str | None:
    """What keeps ``network`` from being a plain ReLU MLP Q-network, or None."""
    if type(network) is not QNetwork:
        return f"the Q-network is a {type(network).__name__}, not a QNetwork"
    if network.dueling:
        return "the Q-network has a dueling head"
    if network.encoder is not None:
        return "the Q-network has a CNN encoder"
    body = network.net
    if type(body) is not MLP:
        return f"the Q-network's body is a {type(body).__name__}, not a ReLU MLP"
    for i, layer in enumerate(body.layers):
        if type(layer) is not nn.Linear:
            return f"layer {i} of the Q-network is a {type(layer).__name__}"
    for name, module in network.named_modules():
        if any(getattr(module, d, None) for d in _HOOK_DICTS):
            return f"the Q-network's module {name or 'root'!r} has hooks"
        if parametrize.is_parametrized(module):
            return f"the Q-network's module {name or 'root'!r} is parametrized"
    return None
