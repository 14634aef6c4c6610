"""Batch renormalisation (Ioffe 2017, arXiv:1702.03275) and CrossQ's networks built on it
(Bhatt et al. 2024, "CrossQ: Batch Normalization in Deep Reinforcement Learning for
Greater Sample Efficiency and Simplicity", ICLR): an MLP whose every linear layer reads
batch-renormalised inputs, its twin critics and its tanh-squashed Gaussian actor.

Which statistics a forward pass normalises with is an argument, :data:`Norm`, not the
module's ``train()``/``eval()`` mode: ``"running"`` reads the running mean and variance
(acting, evaluation, the next actions of the TD target, the critics inside the actor
loss); ``"batch"`` normalises with the batch's own mean and (unbiased) variance and moves
the running statistics towards them (a training pass during warm-up); ``"renorm"`` does
the same with the batch statistics corrected towards the running ones by Ioffe's ``r`` and
``d``, clipped (a training pass after warm-up). The learner picks the mode from its update
count, so no layer keeps a step counter of its own.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

import torch
from torch import Tensor, nn

from rlloop.modules.encoders import flat_input
from rlloop.modules.q_networks import (
    LOG_STD_MAX,
    LOG_STD_MIN,
    stacked_linears,
    standard_normal,
    tanh_log_det,
)

Norm = Literal["running", "batch", "renorm"]

#: The clips of Ioffe's correction: r in [1/R_MAX, R_MAX], d in [-D_MAX, D_MAX]
#: (sb3-contrib's and SBX's constants).
R_MAX = 3.0
D_MAX = 5.0
_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


class BatchRenorm(nn.Module):
    """One batch renormalisation per member of a stack: ``scale`` and ``bias``
    ``[members, features]`` (learned), running ``mean`` and ``var`` (buffers, starting at
    0 and 1)."""

    def __init__(self, features: int, members: int, momentum: float, eps: float) -> None:
        super().__init__()
        self.momentum, self.eps = momentum, eps
        self.scale = nn.Parameter(torch.ones(members, features))
        self.bias = nn.Parameter(torch.zeros(members, features))
        self.register_buffer("running_mean", torch.zeros(members, features))
        self.register_buffer("running_var", torch.ones(members, features))
        self.running_mean: Tensor
        self.running_var: Tensor

    @torch.no_grad()
    def statistics(self, x: Tensor, member: int, renorm: bool
                   ) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
        """A training pass's batch mean and (unbiased, as sb3-contrib's ``x.var(0)``)
        variance ``[features]`` of ``x [N, features]``, with Ioffe's ``r`` and ``d`` when
        ``renorm`` (from the running statistics before the move, clipped); moves
        ``member``'s running statistics ``momentum`` of the way towards the batch's."""
        running_mean, running_var = self.running_mean[member], self.running_var[member]
        # Two passes; torch.var_mean over dim 0 takes about ten times as long on a CPU.
        mean = x.mean(0)
        var = (x - mean).square_().sum(0).div_(len(x) - 1)
        r = d = None
        if renorm:
            running_std = (running_var + self.eps).sqrt()
            r = ((var + self.eps).sqrt() / running_std).clamp_(1 / R_MAX, R_MAX)
            d = ((mean - running_mean) / running_std).clamp_(-D_MAX, D_MAX)
        running_mean.add_(self.momentum * (mean - running_mean))
        running_var.add_(self.momentum * (var - running_var))
        return mean, var, r, d

    def forward(self, xs: Sequence[Tensor], norm: Norm, detach_params: bool = False
                ) -> list[Tensor]:
        """``scale (x - mean) / sqrt(var + eps) + bias`` of each member's ``x [N, features]``
        with the running statistics, or in a training pass the batch's (through
        :class:`_BatchRenormFunction`, gradients through them included)."""
        scales, biases = self.scale.unbind(0), self.bias.unbind(0)  # one backward op each
        out = []
        for member, (x, scale, bias) in enumerate(zip(xs, scales, biases, strict=True)):
            if detach_params:
                scale, bias = scale.detach(), bias.detach()
            if norm == "running":
                a = scale * (self.running_var[member] + self.eps).rsqrt()
                out.append(torch.addcmul(bias - self.running_mean[member] * a, x, a))
            else:
                stats = self.statistics(x, member, norm == "renorm")
                out.append(_BatchRenormFunction.apply(x, scale, bias, *stats, self.eps))
        return out


class _BatchRenormFunction(torch.autograd.Function):
    """A training pass's normalisation, forward and backward by hand: ``y = a x + (bias -
    m a)`` with ``a = scale / sqrt(v + eps)``, where ``m = mean - d std / r`` and ``v = var /
    r^2`` (``m = mean``, ``v = var`` without renormalisation), ``mean`` and ``var`` the
    batch's (functions of ``x``, their gradients included), ``r`` and ``d`` constants.
    Autograd's graph of the same takes about twice the passes over ``x``
    (``tests/algorithms/test_crossq.py`` checks the gradients against sb3-contrib's
    ``BatchRenorm1d``)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, scale: Tensor, bias: Tensor, mean: Tensor, var: Tensor,
                r: Tensor | None, d: Tensor | None, eps: float) -> Tensor:
        m, v = (mean, var) if r is None or d is None else (
            mean - d * var.sqrt() / r, var / r.square())
        inv_std = (v + eps).rsqrt()
        a = scale * inv_std
        ctx.save_for_backward(x, scale, mean, var, m, inv_std, r, d)
        return torch.addcmul(bias - m * a, x, a)

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor | None, ...]:
        x, scale, mean, var, m, inv_std, r, d = ctx.saved_tensors
        n = len(x)
        a = scale * inv_std
        sum_g = g.sum(0)
        sum_g_xm = (g * x).sum(0) - m * sum_g  # sum of g (x - m)
        grad_x = None
        if ctx.needs_input_grad[0]:
            grad_m = -a * sum_g
            grad_v = -0.5 * a * inv_std.square() * sum_g_xm
            if r is not None:  # through m = mean - d sqrt(var) / r and v = var / r^2
                grad_var = grad_v / r.square() - grad_m * d / (2 * r * var.sqrt())
            else:
                grad_var = grad_v
            # dmean/dx = 1/n; dvar/dx = 2 (x - mean) / (n - 1)
            grad_x = torch.addcmul(grad_m / n, g, a)
            grad_x = grad_x.addcmul_(x - mean, grad_var * (2 / (n - 1)))
        grad_scale = sum_g_xm * inv_std if ctx.needs_input_grad[1] else None
        grad_bias = sum_g if ctx.needs_input_grad[2] else None
        return grad_x, grad_scale, grad_bias, None, None, None, None, None


class RenormMLP(nn.Module):
    """``members`` independent MLPs ``in_dim -> hidden... -> out_dim`` on the same input,
    each linear layer preceded by a :class:`BatchRenorm` and followed by a ReLU (none at the
    output), as sb3-contrib's CrossQ networks. Each layer's weights are stacked
    ``[members, in, out]`` (one parameter, one Adam state for all members)."""

    def __init__(self, in_dim: int, hidden: Sequence[int], out_dim: int, members: int,
                 momentum: float, eps: float) -> None:
        super().__init__()
        self.members = members
        dims = [in_dim, *hidden, out_dim]
        self.norms = nn.ModuleList(BatchRenorm(a, members, momentum, eps) for a in dims[:-1])
        self.weights, self.biases = stacked_linears(dims, members)

    @property
    def dtype(self) -> torch.dtype:
        return self.weights[0].dtype

    def forward(self, x: Tensor, norm: Norm, detach_params: bool = False) -> list[Tensor]:
        """Each member's output ``[N, out_dim]`` for ``x [N, in_dim]``; ``detach_params``
        evaluates the members as constants (gradients reach ``x`` only)."""
        hs = [x] * self.members
        last = len(self.weights) - 1
        for i, (renorm, w, b) in enumerate(zip(self.norms, self.weights, self.biases,
                                               strict=True)):
            if detach_params:
                w, b = w.detach(), b.detach()
            # unbind: each member's view, whose backward fills the stacked gradient at once
            hs = [torch.addmm(b_m, h, w_m) for h, w_m, b_m in
                  zip(renorm(hs, norm, detach_params), w.unbind(0), b.unbind(0), strict=True)]
            if i < last:
                hs = [h.relu_() for h in hs]
        return hs


class RenormTwinQ(nn.Module):
    """CrossQ's critics ``Q_1 .. Q_members(s, a)``: a :class:`RenormMLP` on ``[s, a]``."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: Sequence[int], momentum: float,
                 eps: float, members: int = 2) -> None:
        super().__init__()
        self.net = RenormMLP(obs_dim + act_dim, hidden, 1, members, momentum, eps)

    def forward(self, obs: Tensor, action: Tensor, norm: Norm = "running",
                detach_params: bool = False) -> Tensor:
        """``[members, N]`` Q-values of ``(obs [N, *obs], action [N, *act])``."""
        dtype = self.net.dtype
        x = torch.cat([flat_input(obs, dtype), action.flatten(1).to(dtype)], 1)
        return torch.cat(self.net(x, norm, detach_params), 1).t()


class RenormTanhGaussianActor(nn.Module):
    """SAC's tanh-squashed Gaussian policy on a :class:`RenormMLP` (one member) whose last
    layer gives the mean and the log std, ``log sigma`` clamped to ``[-20, 2]``.

    The acting methods (:meth:`sample`, :meth:`mode`) read the running statistics; the
    learner's :meth:`forward` names its :data:`Norm`.
    """

    def __init__(self, obs_dim: int, act_dim: int, hidden: Sequence[int], momentum: float,
                 eps: float) -> None:
        super().__init__()
        self.act_dim = act_dim
        self.net = RenormMLP(obs_dim, hidden, 2 * act_dim, 1, momentum, eps)

    def _mean_log_std(self, obs: Tensor, norm: Norm) -> tuple[Tensor, Tensor]:
        mean, raw_log_std = self.net(flat_input(obs, self.net.dtype), norm)[0].chunk(2, -1)
        return mean, raw_log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)

    def forward(self, obs: Tensor, generator: torch.Generator | None = None,
                noise: Tensor | None = None, norm: Norm = "running"
                ) -> tuple[Tensor, Tensor]:
        """A reparameterised action ``[N, d]`` and its log-probability ``[N]`` (``noise``:
        the standard normal draw, else drawn from ``generator``)."""
        mean, log_std = self._mean_log_std(obs, norm)
        eps = standard_normal(mean.shape, mean, generator) if noise is None else noise
        u = mean + eps * log_std.exp()
        gauss = (-0.5 * eps.square() - log_std).sum(-1) - self.act_dim * _LOG_SQRT_2PI
        return torch.tanh(u), gauss - tanh_log_det(u)

    def sample(self, obs: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """An exploring action, with the running statistics."""
        return self(obs, generator)[0]

    def mode(self, obs: Tensor) -> Tensor:
        """The deterministic action ``tanh(mu(s))``, with the running statistics."""
        return torch.tanh(self._mean_log_std(obs, "running")[0])
