"""A ReLU MLP's gradient without autograd: a hand-derived backward pass.

DQN's update on CartPole is a 64-row batch through a ``[256, 256]`` MLP: about 25 MFLOP,
a quarter of a millisecond of matmuls on one CPU thread, and autograd's graph costs as
much again. :class:`MLPBackprop` keeps the arithmetic and little else:
:meth:`~MLPBackprop.forward` keeps each layer's input; :meth:`~MLPBackprop.backward`
writes ``dL/dW = g^T a`` and ``dL/db = sum g`` into each parameter's ``.grad`` and
passes ``g <- (g W) * [a > 0]`` down, layer by layer.

It reads the module's parameters on every call and owns no tensors, so the module stays
an ordinary module: copies, ``load_state_dict`` and checkpoints work as before, and the
optimiser is the same one the autograd path would use. The gradients equal autograd's up
to float rounding (``tests/test_mlp_backprop.py``).
"""

from __future__ import annotations

from typing import cast

import torch
from torch import Tensor, nn

from rlloop.modules.q_networks import MLP


class MLPBackprop:
    """Forward and backward passes of a plain ReLU :class:`~rlloop.modules.q_networks.MLP`."""

    def __init__(self, mlp: MLP) -> None:
        self.mlp = mlp

    def _layers(self) -> list[nn.Linear]:
        return cast(list[nn.Linear], list(self.mlp.layers))

    @torch.no_grad()
    def forward(self, x: Tensor) -> tuple[Tensor, list[Tensor]]:
        """The output ``[B, out]`` and the input of every layer (for :meth:`backward`)."""
        inputs = []
        layers = self._layers()
        last = len(layers) - 1
        for i, layer in enumerate(layers):
            inputs.append(x)
            x = torch.addmm(layer.bias, x, layer.weight.t())
            if i < last:
                x = x.relu_()
        return x, inputs

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
