"""A learner's state as data: its components, and the checks saved weights must pass.

:meth:`Learner.get_state <rlloop.learners.learner.Learner.get_state>` and ``set_state``
gather and restore the components; what restoring checks and copies lives here, apart from
the update machinery, so that every refusal of a saved state reads in one place.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from rlloop.config.gradient_clip import LearnerError
from rlloop.errors import SavedStateError

#: ``env_steps`` is the schedules' timeline: learning rates and scheduled hyperparameters
#: are functions of it, so it is all the state they have.
STATE_COMPONENTS = ("module", "optimizer", "metrics_logger", "weights_seq_no",
                    "should_module_be_updated", "env_steps")


def select_components(components: str | Iterable[str] | None,
                      not_components: str | Iterable[str] | None) -> set[str]:
    """``components`` (all when none are named) minus ``not_components``; an unknown name
    is a ``LearnerError`` listing the known ones."""
    def as_set(x: str | Iterable[str] | None) -> set[str]:
        return {x} if isinstance(x, str) else set(x or ())

    wanted = as_set(components) or set(STATE_COMPONENTS)
    unknown = (wanted | as_set(not_components)) - set(STATE_COMPONENTS)
    if unknown:
        raise LearnerError(f"unknown state components {sorted(unknown)}; "
                           f"choose from {list(STATE_COMPONENTS)}")
    return wanted - as_set(not_components)


def check_saved_weights(modules: nn.ModuleDict, saved: Mapping[str, Any]) -> None:
    """``SavedStateError`` unless each saved state dict in ``saved`` is one of ``modules``'
    with the same names and shapes: ``load_state_dict`` copies the tensors that fit before
    it refuses the others (a transposed weight), so the check must come first."""
    for module_id, state in saved.items():
        what = f"saved weights of module {module_id!r}"
        if module_id not in modules:
            raise SavedStateError(f"{what}: this learner has only {sorted(modules)}")
        built = modules[module_id].state_dict()
        if not isinstance(state, Mapping):
            raise SavedStateError(f"{what} are a {type(state).__name__}, not a state dict")
        if missing := sorted(built.keys() - state.keys()):
            raise SavedStateError(f"{what} lack {missing}")
        if unknown := sorted(map(str, state.keys() - built.keys())):
            raise SavedStateError(f"{what} hold unknown {unknown}")
        for name, tensor in built.items():
            value = state[name]
            if isinstance(tensor, Tensor) and not (
                    isinstance(value, Tensor) and value.shape == tensor.shape):
                found = list(value.shape) if isinstance(value, Tensor) else type(value)
                raise SavedStateError(f"saved weight {module_id}.{name} has shape "
                                      f"{found}, the built module's {list(tensor.shape)}")


def nonfinite_weights(modules: nn.ModuleDict) -> list[str]:
    """``<module id>.<name>`` of each floating-point parameter or buffer holding a NaN or an
    infinity (one host sync for all of them)."""
    named = [(f"{m}.{k}", t) for m, module in modules.items()
             for k, t in module.state_dict().items()
             if isinstance(t, Tensor) and (t.is_floating_point() or t.is_complex())]
    if not named:
        return []
    finite = torch.stack([torch.isfinite(t).all() for _, t in named]).tolist()
    return [name for (name, _), ok in zip(named, finite, strict=True) if not ok]


def cloned(value: Any) -> Any:
    """``value`` with every tensor inside dicts, lists and tuples copied."""
    if isinstance(value, Tensor):
        return value.clone()
    if isinstance(value, Mapping):
        return {k: cloned(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(cloned(v) for v in value)
    return value
