"""Checkpoint rng (see the package docstring)."""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from rlloop.checkpoint.format import _log
from rlloop.errors import SavedStateError

# ---------------------------------------------------------------- RNG state


def capture_rng_state() -> dict[str, Any]:
    """Every global RNG as checkpointable data: torch CPU (+CUDA), numpy, python ``random``."""
    version, internal, gauss_next = random.getstate()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(legacy=False),
        "python": {"version": version, "state": list(internal), "gauss_next": gauss_next},
    }
    if torch.cuda.is_available():
        state["torch_cuda"] = list(torch.cuda.get_rng_state_all())
    return state


def restore_rng_state(state: Mapping[str, Any]) -> None:
    """Restore what :func:`capture_rng_state` captured, so later draws are bit-identical.

    Raises ``SavedStateError`` (a ValueError), before any generator is set, for a state
    of another shape than this Python, NumPy and torch keep (see :func:`_checked`).
    """
    missing = {"torch", "numpy", "python"} - state.keys()
    if missing:
        raise ValueError(f"RNG state lacks {sorted(missing)}; pass capture_rng_state()'s output")
    torch_state, np_state, py_state, cuda = _checked(state)  # validate all, then set
    torch.set_rng_state(torch_state)
    np.random.set_state(np_state)
    random.setstate(py_state)
    if cuda:
        if torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)
        else:
            _log.warning("checkpoint has CUDA RNG state for %d devices; not restored here",
                         len(cuda))


def _checked(state: Mapping[str, Any]) -> tuple[torch.Tensor, dict[str, Any],
                                                tuple[Any, ...], list[torch.Tensor]]:
    """The saved states in the exact form each library keeps, or ``SavedStateError``: a
    resealed checkpoint can hold anything, and each library refuses its part with its own
    error type, after the generators before it were set."""
    torch_state = _generator_bytes(state["torch"], "rng.torch", torch.get_rng_state().numel())
    cuda = state.get("torch_cuda") or []
    if not isinstance(cuda, list | tuple):
        raise SavedStateError(f"rng.torch_cuda is a {type(cuda).__name__}, not a list")
    restorable = torch.cuda.is_available() and len(cuda) == torch.cuda.device_count()
    # (CUDA states are restored only on as many devices: elsewhere their size is unknown)
    cuda = [_generator_bytes(s, f"rng.torch_cuda.{i}",
                             torch.cuda.get_rng_state(i).numel() if restorable else None)
            for i, s in enumerate(cuda)]
    return torch_state, _numpy_state(state["numpy"]), _python_state(state["python"]), cuda


def _generator_bytes(value: Any, name: str, size: int | None) -> torch.Tensor:
    """A torch generator's state: ``size`` bytes (any number when None) in a 1-D tensor."""
    if not (isinstance(value, torch.Tensor) and value.dtype == torch.uint8 and value.dim() == 1
            and (size is None or value.numel() == size)):
        found = (f"{value.dtype} {list(value.shape)}" if isinstance(value, torch.Tensor)
                 else type(value).__name__)
        want = "a 1-D uint8 tensor" if size is None else f"{size} bytes (uint8 [{size}])"
        raise SavedStateError(f"{name} is {found}; torch's generator state is {want}")
    return value.to("cpu")


def _numpy_state(value: Any) -> dict[str, Any]:
    """NumPy's global generator state (``get_state(legacy=False)``): MT19937's 624 words."""
    current = np.random.get_state(legacy=False)
    name, words = current["bit_generator"], len(current["state"]["key"])
    inner = value.get("state") if isinstance(value, Mapping) else None
    key = inner.get("key") if isinstance(inner, Mapping) else None
    if not (isinstance(value, Mapping) and value.keys() == {"bit_generator", "state",
                                                            "has_gauss", "gauss"}
            and value["bit_generator"] == name and isinstance(inner, Mapping)
            and inner.keys() == {"key", "pos"} and isinstance(key, np.ndarray)
            and key.dtype == np.uint32 and key.shape == (words,)
            and type(inner["pos"]) is int and 0 <= inner["pos"] <= words
            and value["has_gauss"] in (0, 1) and type(value["has_gauss"]) is int
            and type(value["gauss"]) is float and math.isfinite(value["gauss"])):
        raise SavedStateError(f"rng.numpy is not NumPy's global {name} state (bit_generator "
                              f"{name!r}, state.key uint32 [{words}], state.pos 0..{words}, "
                              "has_gauss 0 or 1, a finite gauss)")
    return {**value, "state": {"key": key.copy(), "pos": inner["pos"]}}


def _python_state(value: Any) -> tuple[Any, ...]:
    """``random.getstate()``: (version, 624 32-bit words + a position up to 624, gauss)."""
    version, internal, _ = random.getstate()
    words = value.get("state") if isinstance(value, Mapping) else None
    gauss = value.get("gauss_next") if isinstance(value, Mapping) else None
    if not (isinstance(value, Mapping) and value.keys() == {"version", "state", "gauss_next"}
            and value["version"] == version and type(value["version"]) is int
            and isinstance(words, list | tuple) and len(words) == len(internal)
            and all(type(w) is int and 0 <= w < 2**32 for w in words)
            and words[-1] <= len(internal) - 1
            and (gauss is None or (type(gauss) is float and math.isfinite(gauss)))):
        raise SavedStateError(f"rng.python is not Python's random state (version {version}, "
                              f"state: {len(internal)} integers in [0, 2**32) the last of "
                              f"them at most {len(internal) - 1}, gauss_next None or a "
                              "finite number)")
    return version, tuple(words), gauss
