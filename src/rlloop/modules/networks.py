"""Small network builders shared by every algorithm."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.modules import module as torch_module

ACTIVATIONS: dict[str, type[nn.Module]] = {"tanh": nn.Tanh, "relu": nn.ReLU, "elu": nn.ELU}


def mlp(
    in_dim: int,
    hidden: Sequence[int],
    out_dim: int,
    *,
    activation: str = "tanh",
    out_gain: float = 1.0,
    ortho_init: bool = True,
) -> nn.Sequential:
    """An MLP with orthogonal initialisation (gain sqrt(2) inside, ``out_gain`` at the end).

    Orthogonal init with a small output gain for the policy head is what makes PPO
    reliable on small tasks (Andrychowicz et al., 2021, "What Matters in On-Policy RL").
    ``ortho_init=False`` keeps PyTorch's default initialisation (SB3's ``ortho_init``).
    """
    layers: list[nn.Module] = []
    dims = [in_dim, *hidden]
    for a, b in itertools.pairwise(dims):
        layers += [_init(nn.Linear(a, b), math.sqrt(2), ortho_init), ACTIVATIONS[activation]()]
    layers.append(_init(nn.Linear(dims[-1], out_dim), out_gain, ortho_init))
    return nn.Sequential(*layers)


def _init(layer: nn.Linear, gain: float, ortho_init: bool = True) -> nn.Linear:
    if ortho_init:
        nn.init.orthogonal_(layer.weight, gain)
        nn.init.zeros_(layer.bias)
    return layer


def flat_dim(shape: Sequence[int]) -> int:
    """Number of elements in one observation or action of ``shape``."""
    return int(torch.Size(shape).numel())


def run_layers(net: nn.Sequential, x: Tensor, stop: int | None = None) -> Tensor:
    """``net[:stop](x)``: where the layers are plain ``Linear``, ``Tanh``, ``ReLU`` or ``ELU``
    modules without hooks, their functions are called as their ``forward`` calls them.

    The same ops in the same order, so the same results and gradients. A module call costs
    about 6 µs of Python on a CPU, more than a 64-unit layer's arithmetic on a rollout
    step's few rows: six calls per MLP were a third of a CartPole policy step. Any other
    layer, a hook anywhere (the layer's, the net's or a global one), a compiled module or a
    TorchScript trace takes the module calls.
    """
    layers = list(net)[:stop] if stop is not None else net
    if (_hooked(net) or net._compiled_call_impl is not None
            or torch._C._get_tracing_state() or torch_module._global_forward_hooks
            or torch_module._global_forward_pre_hooks or torch_module._global_backward_hooks
            or torch_module._global_backward_pre_hooks):
        return net[:stop](x) if stop is not None else net(x)
    for layer in layers:
        kind = type(layer)
        if (kind not in _PLAIN or layer._compiled_call_impl is not None
                or layer._forward_hooks or layer._forward_pre_hooks
                or layer._backward_hooks or layer._backward_pre_hooks):  # (_hooked, inline)
            x = layer(x)
        elif kind is nn.Linear:  # (its parameters read as nn.Module.__getattr__ finds them)
            x = F.linear(x, cast(Tensor, layer._parameters["weight"]), layer._parameters["bias"])
        elif kind is nn.Tanh:
            x = torch.tanh(x)
        elif kind is nn.ReLU:
            x = F.relu(x, cast(bool, layer.inplace))
        else:
            x = F.elu(x, cast(float, layer.alpha), cast(bool, layer.inplace))
    return x


#: The layer types :func:`run_layers` calls the functions of.
_PLAIN = frozenset({nn.Linear, nn.Tanh, nn.ReLU, nn.ELU})


def _hooked(module: nn.Module) -> bool:
    """Whether ``module`` has a hook of its own (a module call runs it)."""
    return bool(module._forward_hooks or module._forward_pre_hooks
                or module._backward_hooks or module._backward_pre_hooks)
