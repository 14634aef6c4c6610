"""What a config may name for its modules, checked without importing torch: configs are
validated where the CLI parses them, before torch's second of import."""

from __future__ import annotations

from typing import Literal

from rlloop.errors import ConfigError

EncoderKind = Literal["auto", "mlp", "nature_cnn"]
#: ``<algo>.encoder`` settings (:func:`rlloop.modules.encoders.build_encoder` builds them).
ENCODERS: tuple[str, ...] = ("auto", "mlp", "nature_cnn")
#: ``<algo>.cnn_precision`` settings: the dtype the Nature CNN computes in.
CNN_PRECISIONS: tuple[str, ...] = ("float32", "bfloat16")


def check_cnn_precision(value: str, key: str) -> None:
    """``ConfigError`` unless ``value`` is one of :data:`CNN_PRECISIONS`."""
    if value not in CNN_PRECISIONS:
        raise ConfigError(f"{key} must be one of {list(CNN_PRECISIONS)}, got {value!r}")


def check_net_path(path: str, key: str) -> None:
    """``ConfigError`` unless ``path`` has the form ``module:QualName``."""
    module, sep, name = path.partition(":")
    if not sep or not module.strip() or not name.strip() or "<" in name:
        raise ConfigError(f"{key} must name a network as module:Class (e.g. mynets:Encoder), "
                          f"got {path!r}")
