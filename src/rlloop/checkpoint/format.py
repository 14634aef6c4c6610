"""Checkpoint format (see the package docstring)."""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlloop.errors import CheckpointError as CheckpointError  # defined torch-free, for the CLI
from rlloop.errors import EnvError, RlloopError

FORMAT_VERSION: int = 1
MANIFEST = "manifest.json"

_log = logging.getLogger(__name__)
_TAG = "__rlloop__"  # marks a JSON object that encodes a non-JSON value
_JSON_SAFE_INT = 2**53  # larger ints are stored as hex strings so no JSON reader rounds them
_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]{0,127}")
_STEP_RE = re.compile(r"[0-9]+")
_LEFTOVER_RE = re.compile(r"\.(?P<name>.+)\.(?P<kind>tmp|old|del)-(?P<pid>[0-9]+)-[0-9a-f]+")
_TENSOR_DTYPES = frozenset({
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16,
    torch.uint32, torch.uint64, torch.float16, torch.bfloat16, torch.float32, torch.float64,
    torch.complex64,
})  # fmt: skip


class CheckpointNotFoundError(CheckpointError):
    """No committed checkpoint at the path."""


class CheckpointCorruptError(CheckpointError):
    """Truncated or damaged file, hash mismatch, missing member or broken manifest."""


class CheckpointVersionError(CheckpointError):
    """Written by a newer rlloop (``format_version`` > :data:`FORMAT_VERSION`)."""


class CheckpointMismatchError(CheckpointError):
    """Strict load: the checkpoint's components differ from the expected ones."""


def _corrupt(file: Path, problem: str) -> CheckpointCorruptError:
    return CheckpointCorruptError(
        f"{file}: {problem}. The checkpoint is damaged; load an older one "
        "(CheckpointManager.latest() skips damaged checkpoints) or save it again."
    )


@contextmanager
def restoring(path: Path) -> Iterator[None]:
    """Applying the values of the checkpoint at ``path`` to a built run: a value it cannot
    take is a damaged checkpoint (:class:`CheckpointCorruptError` naming it), not a crash.

    Its hashes only prove the files are the ones written with them, and a manifest can be
    resealed: a wrong type, a counter out of range, a shape unlike the built module's or
    NaN weights are damage found only here (``SavedStateError``, or the ``KeyError``,
    ``TypeError`` or ``ValueError`` of a value in the wrong place).
    """
    try:
        yield
    except (RlloopError, EnvError):  # bad config or env: the checkpoint is not to blame
        raise
    except (KeyError, TypeError, ValueError, IndexError) as e:
        problem = _one_clause(e)
        raise _corrupt(path, f"lacks {problem}, which the run needs" if type(e) is KeyError
                       else f"holds a state this run cannot take: {problem}") from e


def _one_clause(error: Exception) -> str:
    """The error's message on one line, without sentence breaks (see ``_first_clause`` of
    ``rlloop.runs.saved``, which cuts a checkpoint error's advice at the first one)."""
    return " ".join(str(error).split()).replace(". ", "; ") or type(error).__name__


@dataclass(frozen=True)
class Checkpoint:
    """A loaded checkpoint. ``components`` and ``metadata`` are plain data (see module doc)."""

    path: Path
    components: dict[str, Any]
    metadata: dict[str, Any]
    format_version: int
    created: str = ""
    rlloop_version: str = ""


# ---------------------------------------------------------------- values <-> JSON + tensors


class _Encoder:
    """Turns a value into a JSON skeleton, moving tensors and arrays into ``self.tensors``."""

    def __init__(self, component: str | None) -> None:
        self.component = component  # None: tensors are not allowed (metadata, dict keys)
        self.tensors: dict[str, torch.Tensor] = {}
        self._storages: set[int] = set()
        self._open: set[int] = set()  # containers on the current path, to report cycles

    def encode(self, value: Any, where: str) -> Any:
        if isinstance(value, np.generic) and value.dtype.kind in "biuf" and value.itemsize <= 8:
            # before float: np.float64 subclasses float but must come back as np.float64
            return {_TAG: "npscalar", "dtype": value.dtype.str, "value": self.encode(
                value.item(), where)}
        if value is None or isinstance(value, bool | str):
            return value
        if isinstance(value, int):
            return value if abs(value) < _JSON_SAFE_INT else {_TAG: "int", "hex": hex(value)}
        if isinstance(value, float):
            return value if math.isfinite(value) else {_TAG: "float", "value": repr(value)}
        if isinstance(value, torch.Tensor):
            return self._tensor(value, where, "tensor", str(value.dtype).removeprefix("torch."))
        if isinstance(value, np.ndarray):
            return self._array(value, where)
        if isinstance(value, Mapping | list | tuple):
            if id(value) in self._open:
                raise TypeError(f"cannot checkpoint {where}: it contains itself")
            self._open.add(id(value))
            try:
                return self._container(value, where)
            finally:
                self._open.discard(id(value))
        raise TypeError(
            f"cannot checkpoint {where}: {type(value).__qualname__} is not data; convert it to "
            "dicts, lists, tuples, tensors, arrays or JSON scalars (e.g. via its state_dict())"
        )

    def _container(self, value: Mapping[Any, Any] | list[Any] | tuple[Any, ...], where: str) -> Any:
        if isinstance(value, list):
            return [self.encode(v, f"{where}.{i}") for i, v in enumerate(value)]
        if isinstance(value, tuple):
            if type(value) not in (tuple, torch.Size):
                raise TypeError(f"cannot checkpoint {where}: convert the namedtuple to a dict")
            return {_TAG: "tuple", "items": [self.encode(v, f"{where}.{i}") for i, v in
                                             enumerate(value)]}
        if all(isinstance(k, str) for k in value) and _TAG not in value:
            return {k: self.encode(v, f"{where}.{k}") for k, v in value.items()}
        keys = _Encoder(None)
        return {_TAG: "dict", "items": [[keys.encode(k, f"{where} key"), self.encode(
            v, f"{where}.{k}")] for k, v in value.items()]}

    def _array(self, array: np.ndarray, where: str) -> dict[str, Any]:
        if array.dtype.kind not in "biufc":
            raise TypeError(f"cannot checkpoint {where}: numpy dtype {array.dtype} is not numeric")
        if not array.dtype.isnative:
            array = array.astype(array.dtype.newbyteorder("="))
        if not (array.flags.c_contiguous and array.flags.writeable):
            array = array.copy(order="C")
        return self._tensor(torch.from_numpy(array), where, "ndarray", array.dtype.str)

    def _tensor(self, t: torch.Tensor, where: str, kind: str, dtype: str) -> dict[str, Any]:
        if self.component is None:
            raise TypeError(f"cannot checkpoint {where}: put tensors in a component, not here")
        if t.layout != torch.strided or t.dtype not in _TENSOR_DTYPES:
            raise TypeError(f"cannot checkpoint {where}: {t.dtype} {t.layout} tensors unsupported")
        t = t.detach().to("cpu").resolve_conj().resolve_neg().contiguous()
        if t.numel() > 0:  # safetensors refuses tensors sharing memory; save independent copies
            ptr = t.untyped_storage().data_ptr()
            if ptr in self._storages:
                t = t.clone()
            self._storages.add(t.untyped_storage().data_ptr())
        key = where.removeprefix(f"{self.component}.") if where != self.component else "tensor"
        base, n = key, 1
        while key in self.tensors or key == "__metadata__":
            n += 1
            key = f"{base}#{n}"
        self.tensors[key] = t
        return {_TAG: kind, "key": key, "dtype": dtype, "shape": list(t.shape)}


class _Decoder:
    """Rebuilds values from a skeleton; only the node types written by :class:`_Encoder`."""

    def __init__(self, tensors: Mapping[str, torch.Tensor], file: Path) -> None:
        self.tensors, self.file = tensors, file
        self.used: set[str] = set()

    def decode(self, node: Any) -> Any:
        try:
            value = self._node(node)
        except (KeyError, TypeError, ValueError, AttributeError, RecursionError) as e:
            raise _corrupt(self.file, f"malformed entry in manifest.json ({e!r})") from e
        if self.used != set(self.tensors):
            raise _corrupt(self.file, "its tensors do not match those listed in manifest.json")
        return value

    def _node(self, node: Any) -> Any:
        if node is None or isinstance(node, bool | int | float | str):
            return node
        if isinstance(node, list):
            return [self._node(n) for n in node]
        if not isinstance(node, dict):
            raise TypeError(f"unexpected {type(node).__name__} node")
        tag = node.get(_TAG)
        if tag is None:
            return {k: self._node(v) for k, v in node.items()}
        if tag == "tuple":
            return tuple(self._node(n) for n in _typed(node, "items", list))
        if tag == "dict":
            return {self._node(k): self._node(v) for k, v in _typed(node, "items", list)}
        if tag == "int":
            return int(_typed(node, "hex", str), 16)
        if tag == "float" and node.get("value") in ("nan", "inf", "-inf"):
            return float(node["value"])
        if tag == "npscalar":
            dtype = np.dtype(_typed(node, "dtype", str))
            if dtype.kind not in "biuf":
                raise ValueError(f"bad numpy scalar dtype {dtype}")
            return dtype.type(self._node(node["value"]))
        if tag in ("tensor", "ndarray"):
            return self._tensor(node, tag)
        raise ValueError(f"unknown node {node!r:.200}")

    def _tensor(self, node: dict[str, Any], tag: str) -> torch.Tensor | np.ndarray:
        key = _typed(node, "key", str)
        if key not in self.tensors or key in self.used:
            raise _corrupt(self.file, f"tensor {key!r} is missing or listed twice")
        self.used.add(key)
        t = self.tensors[key]
        value: torch.Tensor | np.ndarray = t.numpy() if tag == "ndarray" else t
        dtype = value.dtype.str if isinstance(value, np.ndarray) else str(t.dtype)[6:]
        if dtype != node.get("dtype") or list(t.shape) != node.get("shape"):
            raise _corrupt(self.file, f"tensor {key!r} has {dtype}{list(t.shape)}, manifest.json "
                           f"says {node.get('dtype')}{node.get('shape')}")
        return value


def _typed(node: Mapping[str, Any], key: str, kind: type) -> Any:
    value = node[key]
    if not isinstance(value, kind):
        raise TypeError(f"{key!r} should be {kind.__name__}")
    return value


def _manifest_checksum(body: Mapping[str, Any]) -> str:
    """sha256 of the manifest's canonical JSON, without the ``manifest_sha256`` field."""
    canonical = json.dumps(body, ensure_ascii=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def rlloop_version() -> str:
    """The installed rlloop's version ("unknown" when it is run from a source tree)."""
    try:
        return importlib_metadata.version("rlloop")
    except importlib_metadata.PackageNotFoundError:
        return "unknown"
