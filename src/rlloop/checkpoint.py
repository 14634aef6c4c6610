"""Checkpoints are data, never code: a directory with a JSON manifest and safetensors files.

A checkpoint ``<path>/`` holds

- ``manifest.json``: ``format_version``, ``created``, ``rlloop_version``, ``metadata`` and, per
  component, its JSON ``skeleton`` (tensors replaced by placeholders) and its data ``file``
  (name, sha256, bytes). ``manifest_sha256`` seals the manifest's own content.
- ``<component>.safetensors``: the tensors and arrays of one component, if it has any. The keys
  are the dotted paths inside the component, so ``module.safetensors`` of a ``state_dict()`` is
  loadable by any safetensors reader.

Loading never unpickles: JSON goes through :mod:`json`, tensors through safetensors, and every
file's size and sha256 are checked before it is parsed. Any problem raises a typed
:class:`CheckpointError` naming the file; nothing is returned half-loaded.

What round-trips exactly: dicts (any ``Mapping``; keys may be str, int, float, bool, None or
tuples of those), lists, tuples (they come back as tuples, so Adam's ``betas`` stay tuples),
int of any size, float (incl. nan, ±inf, -0.0), str, bool, None, numpy scalars (same type),
numpy arrays (same dtype, native byte order) and torch tensors (same dtype and shape, on CPU,
contiguous, detached, each an independent copy even when the originals shared storage).
``OrderedDict`` comes back as ``dict``, ``torch.Size`` as ``tuple``, ``Parameter`` as ``Tensor``.

Writes are atomic: everything goes into a sibling ``.<name>.tmp-<pid>-<hex>`` directory, is
fsynced, then renamed into place. Replacing swaps old and new in one ``renameat2`` exchange
where Linux supports it, else renames the old one aside (``.<name>.old-...``) first; the old one
is deleted only after the new one is in place. Dot-directories are never checkpoints; those of
dead processes are removed (or, for an interrupted replace, restored) on the next save.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import hashlib
import json
import logging
import math
import os
import random
import re
import secrets
import shutil
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import safetensors
import safetensors.torch
import torch

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


class CheckpointError(Exception):
    """Base class; the message names the file, the problem and the fix."""


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


def _rlloop_version() -> str:
    try:
        return importlib_metadata.version("rlloop")
    except importlib_metadata.PackageNotFoundError:
        return "unknown"


# ---------------------------------------------------------------- writing


def _write_file(file: Path, data: bytes) -> None:
    with open(file, "xb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _sync_and_hash(file: Path) -> dict[str, Any]:
    with open(file, "rb") as f:
        os.fsync(f.fileno())
        digest = hashlib.file_digest(f, "sha256").hexdigest()
        return {"bytes": f.tell(), "sha256": digest}


def _fsync_dir(directory: Path) -> None:
    if os.name == "posix":  # a rename is durable only once its directory is synced
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _sibling(path: Path, kind: str) -> Path:
    return path.with_name(f".{path.name}.{kind}-{os.getpid()}-{secrets.token_hex(4)}")


def _stage(path: Path, components: Mapping[str, Any], metadata: Mapping[str, Any] | None) -> Path:
    """Write a complete checkpoint into a fresh sibling temp dir and return that dir."""
    if path.name.startswith(".") or not path.name:
        raise ValueError(f"{path}: checkpoint names must not start with '.' (reserved for temp)")
    encoded = {}
    for name, value in components.items():  # encode everything first: bad input writes nothing
        if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
            raise ValueError(f"component name {name!r} must match {_NAME_RE.pattern}")
        encoder = _Encoder(name)
        encoded[name] = (encoder.encode(value, name), encoder.tensors)
    meta = _Encoder(None).encode(dict(metadata or {}), "metadata")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _sibling(path, "tmp")
    tmp.mkdir()
    try:
        entries: dict[str, Any] = {}
        for name, (skeleton, tensors) in encoded.items():
            file: dict[str, Any] | None = None
            if tensors:
                # Straight to disk: save() to bytes would hold two extra copies in memory.
                data = tmp / f"{name}.safetensors"
                safetensors.torch.save_file(tensors, data, metadata={"format": "pt"})
                file = {"name": data.name, **_sync_and_hash(data)}
            entries[name] = {"skeleton": skeleton, "file": file}
        body: dict[str, Any] = {
            "format": "rlloop-checkpoint", "format_version": FORMAT_VERSION,
            "created": datetime.now(UTC).isoformat(), "rlloop_version": _rlloop_version(),
            "metadata": meta, "components": entries,
        }
        body["manifest_sha256"] = _manifest_checksum(body)
        _write_file(tmp / MANIFEST, (json.dumps(body, indent=1, allow_nan=False) + "\n").encode())
        for entry in entries.values():  # safetensors creates 0600 files; honour the umask
            if entry["file"] is not None:
                shutil.copymode(tmp / MANIFEST, tmp / entry["file"]["name"])
        _fsync_dir(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return tmp


@functools.cache
def _renameat2() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    fn = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if fn is not None:
        fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
        fn.restype = ctypes.c_int
    return fn


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (Linux ``RENAME_EXCHANGE``); False where unsupported."""
    fn = _renameat2()
    if fn is None:
        return False
    at_fdcwd, rename_exchange = -100, 2
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))


def save_checkpoint(
    path: str | Path, components: Mapping[str, Any], *, metadata: Mapping[str, Any] | None = None
) -> Path:
    """Atomically write a new checkpoint directory at ``path`` (which must not exist yet)."""
    path = Path(path)
    if path.exists() or path.is_symlink():
        raise FileExistsError(f"{path} already exists; use save_replacing() or choose a new name")
    tmp = _stage(path, components, metadata)
    try:
        os.rename(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _fsync_dir(path.parent)
    return path


def save_replacing(
    path: str | Path, components: Mapping[str, Any], *, metadata: Mapping[str, Any] | None = None
) -> Path:
    """Atomically write a checkpoint at ``path``, replacing a checkpoint already there.

    For fixed names such as ``<run>/best``. At every instant either the old or the new
    checkpoint is complete (see the module doc); an existing non-checkpoint is never replaced.
    """
    path = Path(path)
    if path.parent.is_dir():
        _clean_leftovers(path.parent)
    if (path.exists() or path.is_symlink()) and not is_checkpoint(path):
        raise FileExistsError(f"{path} exists and is not a checkpoint; refusing to replace it")
    tmp = _stage(path, components, metadata)
    try:
        if not path.exists():
            os.rename(tmp, path)
        elif not _exchange(tmp, path):  # after an exchange, tmp holds the old checkpoint
            aside = _sibling(path, "old")
            os.rename(path, aside)
            try:
                os.rename(tmp, path)
            except BaseException:
                os.rename(aside, path)
                raise
            tmp = aside
        _fsync_dir(path.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # the unused new one, or the replaced old one
    return path


def _pid_alive(pid: int) -> bool:
    return pid == os.getpid() or psutil.pid_exists(pid)


def _clean_leftovers(root: Path) -> None:
    """Remove temp dirs of dead processes; restore a checkpoint whose replace was interrupted."""
    for entry in root.iterdir():
        match = _LEFTOVER_RE.fullmatch(entry.name)
        if not match or not entry.is_dir() or _pid_alive(int(match["pid"])):
            continue
        target = root / match["name"]
        try:
            if match["kind"] == "old" and not target.exists() and (entry / MANIFEST).is_file():
                os.rename(entry, target)
                _log.warning("restored %s from an interrupted replace", target)
            else:
                shutil.rmtree(entry)
        except OSError as e:  # another process may be cleaning the same folder
            _log.warning("could not clean up %s: %s", entry, e)


# ---------------------------------------------------------------- reading


def is_checkpoint(path: str | Path) -> bool:
    """True for a committed checkpoint directory (not a temp dir; manifest present)."""
    path = Path(path)
    return not path.name.startswith(".") and path.is_dir() and (path / MANIFEST).is_file()


def load_checkpoint(
    path: str | Path, *, expected_components: Iterable[str] | None = None
) -> Checkpoint:
    """Load and verify a checkpoint; never unpickles, never returns a partial result.

    With ``expected_components``, the checkpoint must hold exactly those components
    (:class:`CheckpointMismatchError` lists the missing and unexpected ones).
    """
    return _read(Path(path), expected_components, decode=True)


def verify_checkpoint(path: str | Path) -> None:
    """Check manifest, sizes and hashes without building tensors; raise what loading would."""
    _read(Path(path), None, decode=False)


def _read(path: Path, expected: Iterable[str] | None, decode: bool) -> Checkpoint:
    if not is_checkpoint(path):
        hint = " (rlloop never loads pickled .pt files)" if path.is_file() else ""
        raise CheckpointNotFoundError(
            f"{path / MANIFEST}: not found; {path} is not a committed rlloop checkpoint "
            f"directory{hint}. Check the path, or use CheckpointManager.latest()."
        )
    body = _read_manifest(path / MANIFEST)
    entries: dict[str, Any] = body["components"]
    if expected is not None:
        wanted = {expected} if isinstance(expected, str) else set(expected)
        missing, unexpected = sorted(wanted - entries.keys()), sorted(entries.keys() - wanted)
        if missing or unexpected:
            raise CheckpointMismatchError(
                f"{path / MANIFEST}: components differ: missing {missing}, unexpected "
                f"{unexpected}. Pass the components it was saved with, or load without "
                "expected_components to inspect it."
            )
    components: dict[str, Any] = {}
    for name, entry in entries.items():
        tensors, file = {}, path / MANIFEST
        if entry["file"] is not None:
            file = path / entry["file"]["name"]
            tensors = _read_tensors(file, entry["file"], decode)
        if decode:
            components[name] = _Decoder(tensors, file).decode(entry["skeleton"])
    metadata = _Decoder({}, path / MANIFEST).decode(body["metadata"])
    return Checkpoint(path, components, metadata, body["format_version"],
                      str(body.get("created", "")), str(body.get("rlloop_version", "")))


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name}")


def _read_manifest(file: Path) -> dict[str, Any]:
    try:
        body = json.loads(file.read_bytes().decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise _corrupt(file, f"is not valid JSON ({e})") from e
    version = body.get("format_version") if isinstance(body, dict) else None
    if type(version) is not int or version < 1:
        raise _corrupt(file, "has no valid format_version")
    if version > FORMAT_VERSION:
        raise CheckpointVersionError(
            f"{file}: format_version {version} was written by a newer rlloop; this rlloop "
            f"({_rlloop_version()}) reads format_version <= {FORMAT_VERSION}. Upgrade rlloop."
        )
    if body.pop("manifest_sha256", None) != _manifest_checksum(body):
        raise _corrupt(file, "fails its manifest_sha256 check (modified or damaged)")
    components = body.get("components")
    if not isinstance(components, dict) or "metadata" not in body:
        raise _corrupt(file, "lacks 'components' or 'metadata'")
    for name, entry in components.items():
        ok = isinstance(entry, dict) and _NAME_RE.fullmatch(name) and "skeleton" in entry
        info = entry.get("file") if ok else None
        if not ok or not (info is None or (
            isinstance(info, dict) and info.get("name") == f"{name}.safetensors"
            and type(info.get("bytes")) is int and isinstance(info.get("sha256"), str)
        )):
            raise _corrupt(file, f"has a malformed entry for component {name!r}")
    manifest: dict[str, Any] = body
    return manifest


def _read_tensors(file: Path, info: Mapping[str, Any], decode: bool) -> dict[str, torch.Tensor]:
    try:
        size = file.stat().st_size
    except FileNotFoundError:
        raise _corrupt(file, "is missing (manifest.json lists it)") from None
    if size != info["bytes"]:
        raise _corrupt(file, f"has {size} bytes, manifest.json says {info['bytes']} (truncated?)")
    with open(file, "rb") as f:
        if hashlib.file_digest(f, "sha256").hexdigest() != info["sha256"]:
            raise _corrupt(file, "fails its sha256 check (contents changed)")
    if not decode:
        return {}
    try:  # clone: own memory, not a lazily read mapping of a file that may change or go away
        with safetensors.safe_open(file, framework="pt") as st:
            return {key: st.get_tensor(key).clone() for key in st.keys()}  # noqa: SIM118 (not a dict)
    except Exception as e:  # safetensors raises its own error type for any malformed input
        raise _corrupt(file, f"is not a valid safetensors file ({e})") from e


# ---------------------------------------------------------------- numbered checkpoints


class CheckpointManager:
    """Step-numbered checkpoints ``root/000012345`` with rotation.

    The manager owns the all-digit names in ``root``; other entries (such as ``root/best``,
    written with :func:`save_replacing`) are never listed, rotated or deleted.
    """

    def __init__(self, root: str | Path, keep_last: int = 3) -> None:
        if keep_last < 1:
            raise ValueError(f"keep_last must be >= 1, got {keep_last}")
        self.root, self.keep_last = Path(root), keep_last

    def path_for(self, name: str | int) -> Path:
        """``root/<name>``; step numbers are zero-padded to 9 digits so they sort by name."""
        if isinstance(name, bool) or not (
            (isinstance(name, int) and name >= 0)
            or (isinstance(name, str) and _STEP_RE.fullmatch(name))
        ):
            raise ValueError(f"checkpoint name {name!r} must be a step number; use "
                             "save_replacing() for fixed names such as 'best'")
        return self.root / f"{int(name):09d}"

    def save(
        self, name: str | int, components: Mapping[str, Any], *,
        metadata: Mapping[str, Any] | None = None,
    ) -> Path:
        """Commit a checkpoint, then delete the oldest beyond ``keep_last``."""
        path = self.path_for(name)
        self.root.mkdir(parents=True, exist_ok=True)
        save_replacing(path, components, metadata=metadata)  # also cleans leftovers in root
        self._rotate(path)
        return path

    def all(self) -> list[Path]:
        """Committed checkpoints, oldest first."""
        if not self.root.is_dir():
            return []
        found = [p for p in self.root.iterdir() if _STEP_RE.fullmatch(p.name) and is_checkpoint(p)]
        return sorted(found, key=lambda p: int(p.name))

    def latest(self) -> Path | None:
        """The newest checkpoint that verifies; damaged or partial ones are skipped."""
        for path in reversed(self.all()):
            try:
                verify_checkpoint(path)
                return path
            except (CheckpointCorruptError, CheckpointNotFoundError) as e:
                _log.warning("skipping checkpoint %s: %s", path, e)
        return None

    def load_latest(self, *, expected_components: Iterable[str] | None = None) -> Checkpoint | None:
        """Load the newest loadable checkpoint in one pass (None if there is none)."""
        for path in reversed(self.all()):
            try:
                return load_checkpoint(path, expected_components=expected_components)
            except (CheckpointCorruptError, CheckpointNotFoundError) as e:
                _log.warning("skipping checkpoint %s: %s", path, e)
        return None

    def _rotate(self, just_saved: Path) -> None:
        # Only checkpoints older than the one just committed are deleted, so the newest valid
        # one always survives, even if names were saved out of order.
        paths = self.all()
        older = [p for p in paths if int(p.name) < int(just_saved.name)]
        for path in older[: max(0, len(paths) - self.keep_last)]:
            doomed = _sibling(path, "del")  # rename first: a half-deleted dir is never visible
            try:
                os.rename(path, doomed)
            except OSError as e:  # e.g. another process rotated it already
                _log.warning("could not delete old checkpoint %s: %s", path, e)
                continue
            shutil.rmtree(doomed, ignore_errors=True)


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
    torch_state = torch.as_tensor(state["torch"], dtype=torch.uint8)  # validate all, then set
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
            torch.cuda.set_rng_state_all([torch.as_tensor(s, dtype=torch.uint8) for s in cuda])
        else:
            _log.warning("checkpoint has CUDA RNG state for %d devices; not restored here",
                         len(cuda))
