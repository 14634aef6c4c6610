"""The comparison that the float64 equality tests against a peer library (sb3-contrib's
TQC and CrossQ) make of rlloop's numbers and the peer's on identical inputs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor


def _tensors(value: Any) -> list[Tensor]:
    """A tensor or a (nested one level) list of tensors, flattened."""
    items = value if isinstance(value, list | tuple) else [value]
    return [t for v in items for t in (v if isinstance(v, list | tuple) else [v])]


def assert_equal_to_peer(mine: Mapping[str, Any], theirs: Mapping[str, Any], where: object,
                         rtol: float = 1e-10, atol: float = 1e-10) -> None:
    """Every value of ``theirs`` equals ``mine``'s under the same key: a float to ``atol``
    times ``max(1, |value|)``; a tensor or a list of tensors element by element, as many
    of them as the peer's, to ``rtol`` and ``atol``. ``where`` names the comparison in the
    failure message (an update, a loss)."""
    for key, value in theirs.items():
        if isinstance(value, float):
            assert abs(mine[key] - value) <= atol * max(1.0, abs(value)), (
                where, key, mine[key], value)
            continue
        ours, peer = _tensors(mine[key]), _tensors(value)
        assert len(ours) == len(peer), (where, key, len(ours), len(peer))
        for a, b in zip(ours, peer, strict=True):
            torch.testing.assert_close(a, b.detach(), rtol=rtol, atol=atol,
                                       msg=f"{where}: {key}")
