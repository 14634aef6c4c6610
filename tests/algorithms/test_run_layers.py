"""run_layers: an MLP's layers called as functions, equal to the module calls to the bit,
and the module calls wherever a hook or another layer needs them."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from rlloop.modules.networks import mlp, run_layers


@pytest.mark.parametrize("activation", ["tanh", "relu", "elu"])
def test_outputs_and_gradients_equal_the_module_calls(activation: str) -> None:
    net = mlp(4, (64, 64), 3, activation=activation)
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(0))
    ours, theirs = run_layers(net, x), net(x)
    assert torch.equal(ours, theirs)
    grads = []
    for out in (ours, theirs):
        net.zero_grad()
        out.square().sum().backward()
        grads.append([p.grad.clone() for p in net.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*grads, strict=True))
    assert torch.equal(run_layers(net, x, -1), net[:-1](x))


def test_hooks_and_other_layers_take_the_module_calls() -> None:
    net = mlp(4, (8,), 2)
    x = torch.ones(3, 4)
    heard: list[str] = []
    handle = net[0].register_forward_hook(lambda *_: heard.append("layer"))
    run_layers(net, x)
    handle.remove()
    handle = net.register_forward_pre_hook(lambda *_: heard.append("net"))
    run_layers(net, x)
    handle.remove()
    handle = nn.modules.module.register_module_forward_hook(lambda *_: heard.append("global"))
    run_layers(net, x)
    handle.remove()
    assert heard[:2] == ["layer", "net"] and "global" in heard
    scaled = nn.Sequential(net, nn.Dropout(0.0))  # a layer run_layers does not know
    assert torch.equal(run_layers(scaled, x), net(x))
