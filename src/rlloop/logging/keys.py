"""Metric and param names: nested mappings flattened to ``"a/b"`` keys (torch-free, so
the MLflow child process does not import torch)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeAlias

MetricKey: TypeAlias = str | tuple[Any, ...]


def flatten_key(key: MetricKey) -> str:
    """``("a", "b")`` -> ``"a/b"``; a string is returned unchanged."""
    if isinstance(key, str):
        if not key:
            raise ValueError("metric key must be a non-empty string")
        return key
    if isinstance(key, tuple) and key:
        return "/".join(str(part) for part in key)
    raise TypeError(f"metric key must be a non-empty str or tuple, got {key!r}")


def flatten_mapping(mapping: Mapping[Any, Any], prefix: str = "") -> dict[str, Any]:
    """Flatten nested mappings into ``{"a/b": leaf}``; tuple keys are joined with ``"/"``."""
    flat: dict[str, Any] = {}
    for key, value in mapping.items():
        name = flatten_key(key)
        name = f"{prefix}/{name}" if prefix else name
        if isinstance(value, Mapping):
            flat.update(flatten_mapping(value, name))
        else:
            flat[name] = value
    return flat
