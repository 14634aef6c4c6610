"""Small network builders shared by every algorithm."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import torch
from torch import nn

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
