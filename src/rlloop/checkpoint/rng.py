"""Checkpoint rng (see the package docstring)."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from rlloop.checkpoint.format import _log

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
    """Restore what :func:`capture_rng_state` captured, so later draws are bit-identical."""
    missing = {"torch", "numpy", "python"} - state.keys()
    if missing:
        raise ValueError(f"RNG state lacks {sorted(missing)}; pass capture_rng_state()'s output")
    # validate all, then set; generator states are host tensors whatever the device
    torch_state = torch.as_tensor(state["torch"], dtype=torch.uint8, device="cpu")
    np_state = dict(state["numpy"])
    np_state["state"] = {**np_state["state"],
                         "key": np.asarray(np_state["state"]["key"], dtype=np.uint32)}
    py = state["python"]
    py_state = (py["version"], tuple(py["state"]), py["gauss_next"])
    cuda = state.get("torch_cuda")
    torch.set_rng_state(torch_state)
    np.random.set_state(np_state)
    random.setstate(py_state)
    if cuda:
        if torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all([torch.as_tensor(s, dtype=torch.uint8, device="cpu")
                                          for s in cuda])
        else:
            _log.warning("checkpoint has CUDA RNG state for %d devices; not restored here",
                         len(cuda))
