"""ReLU MLPs' gradients without autograd: hand-derived backward passes.

DQN's update on CartPole is a 64-row batch through a ``[256, 256]`` MLP: about 25 MFLOP,
a quarter of a millisecond of matmuls on one CPU thread, and autograd's graph costs as
much again. :class:`MLPBackprop` keeps the arithmetic and little else:
:meth:`~MLPBackprop.forward` keeps each layer's input; :meth:`~MLPBackprop.backward`
writes ``dL/dW = g^T a`` and ``dL/db = sum g`` into each parameter's ``.grad`` and
passes ``g <- (g W) * [a > 0]`` down, layer by layer.

:class:`TwinMLPBackprop` does the same for the stacked critics of
:class:`~rlloop.modules.q_networks.TwinQ` (``baddbmm`` layers), and can return the
gradient with respect to the input (SAC's actor loss reaches the actor through the
critics' input) without computing the critics' own parameter gradients.

Both run the module's own forward (which records each layer's input), read its
parameters on every call and own no tensors, so the module stays an ordinary module:
copies, ``load_state_dict`` and checkpoints work as before, and the optimiser is the
same one the autograd path would use. The gradients equal autograd's up
to float rounding (``tests/test_mlp_backprop.py``).
"""

from __future__ import annotations

from typing import cast

import torch
from torch import Tensor, nn

from rlloop.modules.q_networks import MLP, TwinQ


class MLPBackprop:
    """Forward and backward passes of a plain ReLU :class:`~rlloop.modules.q_networks.MLP`."""

    def __init__(self, mlp: MLP) -> None:
        self.mlp = mlp

    def _layers(self) -> list[nn.Linear]:
        return cast(list[nn.Linear], list(self.mlp.layers))

    @torch.no_grad()
    def forward(self, x: Tensor) -> tuple[Tensor, list[Tensor]]:
        """The output ``[B, out]`` and the input of every layer (for :meth:`backward`)."""
        inputs: list[Tensor] = []
        return self.mlp.forward(x, inputs), inputs

    @torch.no_grad()
    def backward(self, inputs: list[Tensor], grad_out: Tensor) -> None:
        """Set every parameter's ``.grad`` to ``dL/dparam`` given ``grad_out = dL/d output``
        and the ``inputs`` :meth:`forward` returned (overwrites, never accumulates)."""
        g = grad_out
        layers = self._layers()
        for i in range(len(layers) - 1, -1, -1):
            w, b, a = layers[i].weight, layers[i].bias, inputs[i]
            if w.grad is None or b.grad is None:
                w.grad, b.grad = torch.empty_like(w), torch.empty_like(b)
            torch.mm(g.t(), a, out=w.grad)
            torch.sum(g, 0, out=b.grad)
            if i:  # a is the previous layer's ReLU output: its gradient passes where a > 0
                g = torch.ops.aten.threshold_backward(g.mm(w), a, 0.0)


class TwinMLPBackprop:
    """Forward and backward passes of :class:`~rlloop.modules.q_networks.TwinQ`."""

    def __init__(self, twin: TwinQ) -> None:
        self.twin = twin

    @torch.no_grad()
    def forward(self, obs: Tensor, action: Tensor) -> tuple[Tensor, list[Tensor]]:
        """``[members, B]`` Q-values and every layer's input ``[members, B, in]``."""
        inputs: list[Tensor] = []
        return self.twin.forward(obs, action, inputs=inputs), inputs

    @torch.no_grad()
    def backward(self, inputs: list[Tensor], grad_q: Tensor, *, params: bool = True,
                 input_grad: bool = False) -> Tensor | None:
        """From ``grad_q = dL/dQ`` ``[members, B]``: with ``params``, set the critics'
        ``.grad``; with ``input_grad``, return ``dL/d(obs, action)`` ``[B, in]`` (summed
        over the critics), else None."""
        weights, biases = list(self.twin.weights), list(self.twin.biases)
        g = grad_q.unsqueeze(-1)
        for i in range(len(weights) - 1, -1, -1):
            w, b, a = weights[i], biases[i], inputs[i]
            if params:
                if w.grad is None or b.grad is None:
                    w.grad, b.grad = torch.empty_like(w), torch.empty_like(b)
                torch.bmm(a.transpose(1, 2), g, out=w.grad)
                torch.sum(g, 1, keepdim=True, out=b.grad)
            if i:
                g = torch.ops.aten.threshold_backward(torch.bmm(g, w.transpose(1, 2)), a, 0.0)
            elif input_grad:
                return torch.bmm(g, w.transpose(1, 2)).sum(0)
        return None
