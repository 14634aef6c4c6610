"""Action distributions for discrete and continuous spaces.

Both expose the same three operations the algorithms need, on batched tensors:
``sample``, ``log_prob`` and ``entropy``, plus ``mode`` for deterministic acting.
"""

from __future__ import annotations

import math
from typing import Protocol

import torch
from torch import Tensor

_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


class ActionDist(Protocol):
    def sample(self, generator: torch.Generator | None = None) -> Tensor: ...
    def mode(self) -> Tensor: ...
    def log_prob(self, actions: Tensor) -> Tensor: ...
    def entropy(self) -> Tensor: ...


class Categorical:
    """Categorical over the last dim of ``logits`` ``[B, A]``; actions are int64 ``[B]``."""

    def __init__(self, logits: Tensor) -> None:
        self.log_probs = torch.log_softmax(logits, -1)

    def sample(self, generator: torch.Generator | None = None) -> Tensor:
        # Gumbel-max in its exponential form: argmax(log p - log E), E ~ Exp(1). Four
        # small ops instead of torch.multinomial's setup, and it honours the generator.
        e = torch.empty_like(self.log_probs).exponential_(generator=generator)
        return (self.log_probs - e.log_()).argmax(-1)

    def mode(self) -> Tensor:
        return self.log_probs.argmax(-1)

    def log_prob(self, actions: Tensor) -> Tensor:
        if actions.dtype != torch.int64:  # (a no-op .long() still costs a dispatch)
            actions = actions.long()
        return self.log_probs.gather(-1, actions.unsqueeze(-1)).squeeze(-1)

    def entropy(self) -> Tensor:
        return -(self.log_probs.exp() * self.log_probs).sum(-1)


class DiagGaussian:
    """Diagonal Gaussian with ``mean`` ``[B, D]`` and ``log_std`` broadcastable to it."""

    def __init__(self, mean: Tensor, log_std: Tensor) -> None:
        self.mean = mean
        self.log_std = log_std.expand_as(mean)

    def sample(self, generator: torch.Generator | None = None) -> Tensor:
        noise = torch.randn(self.mean.shape, generator=generator, dtype=self.mean.dtype,
                            device=self.mean.device)
        return self.mean + noise * self.log_std.exp()

    def mode(self) -> Tensor:
        return self.mean

    def log_prob(self, actions: Tensor) -> Tensor:
        z = (actions - self.mean) * torch.exp(-self.log_std)
        return (-0.5 * z.pow(2) - self.log_std - _LOG_SQRT_2PI).sum(-1)

    def entropy(self) -> Tensor:
        return (self.log_std + 0.5 + _LOG_SQRT_2PI).sum(-1)


class MultiCategorical:
    """Independent categoricals, one per entry of ``nvec``, on ``logits`` ``[B, sum(nvec)]``;
    actions int64 ``[B, len(nvec)]``. Log-probabilities and entropies add up over entries."""

    def __init__(self, logits: Tensor, nvec: tuple[int, ...]) -> None:
        self.parts = [Categorical(x) for x in logits.split(list(nvec), dim=-1)]

    def sample(self, generator: torch.Generator | None = None) -> Tensor:
        return torch.stack([p.sample(generator) for p in self.parts], -1)

    def mode(self) -> Tensor:
        return torch.stack([p.mode() for p in self.parts], -1)

    def log_prob(self, actions: Tensor) -> Tensor:
        return torch.stack([p.log_prob(a) for p, a in zip(self.parts, actions.unbind(-1),
                                                          strict=True)], -1).sum(-1)

    def entropy(self) -> Tensor:
        return torch.stack([p.entropy() for p in self.parts], -1).sum(-1)


class Bernoulli:
    """Independent Bernoulli choices with ``logits`` ``[B, n]``; actions int64 ``[B, n]``."""

    def __init__(self, logits: Tensor) -> None:
        self.logits = logits

    def sample(self, generator: torch.Generator | None = None) -> Tensor:
        u = torch.rand(self.logits.shape, generator=generator, dtype=self.logits.dtype,
                       device=self.logits.device)
        return (u < torch.sigmoid(self.logits)).long()

    def mode(self) -> Tensor:
        return (self.logits > 0).long()

    def log_prob(self, actions: Tensor) -> Tensor:
        # log sigmoid(x) for a 1, log sigmoid(-x) for a 0, without overflow.
        signed = torch.where(actions.bool(), self.logits, -self.logits)
        return torch.nn.functional.logsigmoid(signed).sum(-1)

    def entropy(self) -> Tensor:
        p = torch.sigmoid(self.logits)
        return (torch.nn.functional.softplus(self.logits) - p * self.logits).sum(-1)
