"""One gradient update of an off-policy learner: autograd, clipping and Adam, no host sync.

Off-policy learners make thousands of small updates per second, so an update must not
wait on the device: :class:`GuardedStep` skips a non-finite update *on the device*. The
loss's and every clipped gradient norm's finiteness become one flag tensor, which the
optimisers read as ``found_inf``: the same contract through which
``torch.amp.GradScaler`` makes ``Adam(fused=True)`` skip a step (parameters, moments and
step count untouched; ``tests/learners/test_optim_step.py`` pins it). Optimisers without that
contract (a user's SGD) fall back to reading the flag, one sync per update.

Everything here is public torch API (``Adam(fused=True)``, and ``clip_grad_norm_``'s maths
in two halves from :mod:`rlloop.learners.gradients`), so it works across the torch
versions the package accepts and inside ``torch.compile``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from rlloop.learners.adam import Adam
from rlloop.learners.flat_buffers import FlatParameters
from rlloop.learners.gradients import clip_scale, clip_to_norm_, total_norm


def adam(params: Sequence[Tensor], lr: float, eps: float = 1e-8,
         betas: tuple[float, float] = (0.9, 0.999)) -> torch.optim.Adam:
    """``Adam`` with the fused kernel where the parameters' device has one, else foreach
    (rlloop's :class:`~rlloop.learners.adam.Adam`: no ``torch._dynamo`` import in eager use)."""
    try:
        return Adam(params, lr=lr, eps=eps, betas=betas, fused=True)
    except RuntimeError:  # a device without the fused kernel
        return Adam(params, lr=lr, eps=eps, betas=betas, foreach=True)


def skips_on_device(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer.step()`` honours ``found_inf`` (``Adam``/``AdamW`` fused)."""
    return type(optimizer) in (torch.optim.Adam, torch.optim.AdamW, Adam) and all(
        g.get("fused") for g in optimizer.param_groups)


def arm_skip(optimizer: torch.optim.Optimizer, flag: Tensor | None) -> None:
    """Have ``optimizer.step()`` skip itself where ``flag`` (a 0-dim float tensor on the
    parameters' device) is 1.0, read on the device as ``found_inf`` (for optimisers where
    :func:`skips_on_device`); ``None`` disarms it."""
    optimizer.found_inf = flag  # type: ignore[attr-defined]
    optimizer.grad_scale = None  # type: ignore[attr-defined]


@dataclass
class GuardedOptim:
    """One optimiser of a :class:`GuardedStep` and the global-norm clip of its gradients."""

    optimizer: torch.optim.Optimizer
    params: list[Tensor]
    max_grad_norm: float | None = None

    @property
    def flat(self) -> FlatParameters | None:
        """The parameters' flat layout (:mod:`rlloop.learners.flat_buffers`), if the
        optimiser keeps one (:meth:`rlloop.learners.adam.Adam.use_flat`): the norm and the
        clip are then one op each over the whole gradient buffer."""
        return getattr(self.optimizer, "flat", None)


class GuardedStep:
    """``backward`` + clip + step of several optimisers as one update that a non-finite
    loss or gradient norm skips entirely (no optimiser moves), decided on the device.

    Args:
        optims: The optimisers, each over its own parameters.
    """

    #: Guard scratch and statistics, not training state (checkpoints leave them out).
    transient_attrs = frozenset({"flag", "skipped"})

    def __init__(self, optims: Sequence[GuardedOptim] = ()) -> None:
        self.optims: list[GuardedOptim] = []
        self._eager = False  # some optimiser cannot skip on the device
        #: 1.0 if the last update was skipped, else 0.0 (a tensor on the parameters' device).
        self.flag: Tensor | None = None
        #: Updates skipped so far, as a tensor on the parameters' device (read it at records).
        self.skipped: Tensor | None = None
        for optim in optims:
            self.add(optim)

    def add(self, optim: GuardedOptim) -> None:
        if self.flag is None:
            device = optim.params[0].device
            # float32 by name: fused Adam reads ``found_inf`` as float32 whatever the
            # parameters' dtype, and a user's ``torch.set_default_dtype`` must not change it.
            self.flag = torch.zeros((), dtype=torch.float32, device=device)
            self.skipped = torch.zeros((), dtype=torch.float32, device=device)
        if skips_on_device(optim.optimizer):
            # Set once and written in place: no attribute changes per update (compile).
            arm_skip(optim.optimizer, self.flag)
        else:
            self._eager = True
        self.optims.append(optim)

    def __call__(self, loss: Tensor) -> None:
        """Back-propagate ``loss`` into every optimiser's parameters, then :meth:`apply`."""
        for o in self.optims:
            for p in o.params:
                p.grad = None
        loss.backward()  # type: ignore[no-untyped-call]
        self.apply(loss.detach())

    def apply(self, finite: Tensor) -> None:
        """Clip and step on the gradients in ``.grad``, unless ``finite`` or a clipped norm
        says otherwise; counted in :attr:`skipped`.

        ``finite``: a 0-dim bool tensor, or a 0-dim float tensor that is finite exactly
        when the loss is (the loss, a sum of TD errors). A float takes fewer ops: the
        clipped norms are added to it, and the update is skipped where the sum is not
        finite (one of them is not, or, beyond 1e38, the sum overflows float32).
        """
        for o in self.optims:
            if o.max_grad_norm is None:
                continue
            if o.flat is not None and o.flat.intact():
                norm = torch.linalg.vector_norm(o.flat.grad)
                o.flat.grad.mul_(clip_scale(o.max_grad_norm, norm))
            else:
                grads = [p.grad for p in o.params if p.grad is not None]
                if not grads:
                    continue
                norm = total_norm(grads)
                clip_to_norm_(o.params, o.max_grad_norm, norm)
            finite = (finite + norm if finite.is_floating_point()
                      else finite & torch.isfinite(norm))
        assert self.flag is not None and self.skipped is not None
        if finite.is_floating_point():  # x - x is 0 for a finite x, NaN for inf and NaN
            torch.sub(finite, finite, out=self.flag)
            self.flag.ne_(0.0)
        else:
            torch.logical_not(finite, out=self.flag)
        self.skipped.add_(self.flag)
        if self._eager and bool(self.flag):
            return
        for o in self.optims:
            # (a flat layout's gradients are never None; elsewhere, e.g. TD3's actor between
            # delayed updates has none, and its optimiser does not step)
            if o.flat is not None or any(p.grad is not None for p in o.params):
                o.optimizer.step()
