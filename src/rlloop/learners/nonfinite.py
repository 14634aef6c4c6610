"""The learner's non-finite guard: a NaN or an infinity skips an update, never applies it.

A batch is checked before its first minibatch (one host read per device), a step's loss
and gradient norms after its backward pass. Where every optimiser can skip a step on the
device (:mod:`rlloop.learners.optim_step`), the step's flag is armed there instead of read,
so the guard costs no host sync per minibatch.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from rlloop.errors import RlloopError
from rlloop.learners.optim_step import arm_skip, skips_on_device

#: The 0-dim flag :meth:`~rlloop.learners.learner.Learner.gradient_step` adds to a step's
#: stats when the step's skip was decided on the device (1.0: skipped); read and removed
#: before logging.
SKIPPED_KEY = "guard/_step_skipped"


class NonFiniteError(RlloopError, FloatingPointError):
    """A NaN or infinity reached a loss or gradient with ``on_nonfinite="raise"``, or a run
    skipped more of its updates for them than its ``max_skipped_share``."""


def nonfinite_error(what: str, env_steps: int, update: int) -> NonFiniteError:
    """The error ``on_nonfinite="raise"`` raises for a non-finite ``what``."""
    return NonFiniteError(
        f"non-finite {what} at env step {env_steps} (update {update}); the update was not "
        "applied. Lower the learning rate or check the env's observations and rewards, or "
        "set on_nonfinite=skip")


def batch_is_finite(batch: Mapping[str, object]) -> bool:
    """True if every float tensor of every module's batch is finite (one host read per
    device for the whole batch)."""
    checks: dict[torch.device, list[Tensor]] = {}
    for b in batch.values():
        for f in dataclasses.fields(b):  # type: ignore[arg-type]
            v = getattr(b, f.name)
            if isinstance(v, Tensor) and v.is_floating_point():
                checks.setdefault(v.device, []).append(v.reshape(-1))
    # One check over the fields joined (in the widest of their dtypes, which holds every
    # value exactly): five ops per field cost more than the copy on an update's batch.
    return all(bool(all_finite(torch.cat(flat))) for flat in checks.values())


def all_finite(x: Tensor) -> Tensor:
    """``torch.isfinite(x).all()`` in two elementwise ops instead of four (|NaN| < inf is
    False, as |inf| < inf is)."""
    return x.abs().lt(math.inf).all()


def arm_device_skip(optimizers: Sequence[tuple[torch.optim.Optimizer, Sequence[Tensor]]],
                    finite: Tensor) -> Tensor | None:
    """When every optimiser skips a step on the device (``Adam(fused=True)`` reads
    ``found_inf``, as under ``torch.amp.GradScaler``) and holds its parameters where
    ``finite`` is, arm them with ``not finite`` and return that flag (1.0: skipped): the
    step is decided without a host read. None where a host read must decide."""
    if not all(skips_on_device(optimizer) and all(p.device == finite.device for p in params)
               for optimizer, params in optimizers):
        return None
    flag = torch.logical_not(finite).float()
    for optimizer, _ in optimizers:
        arm_skip(optimizer, flag)
    return flag
