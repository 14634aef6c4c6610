"""Checkpoint store (see the package docstring)."""

from __future__ import annotations

import ctypes
import errno
import functools
import hashlib
import json
import os
import re
import secrets
import shutil
import sys
import time
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import safetensors
import safetensors.torch
import torch

from rlloop.checkpoint.format import (
    _LEFTOVER_RE,
    _NAME_RE,
    FORMAT_VERSION,
    MANIFEST,
    Checkpoint,
    CheckpointCorruptError,
    CheckpointMismatchError,
    CheckpointNotFoundError,
    CheckpointVersionError,
    _corrupt,
    _Decoder,
    _Encoder,
    _log,
    _manifest_checksum,
    rlloop_version,
)
from rlloop.system.run_files import pid_alive

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
                try:
                    safetensors.torch.save_file(tensors, data, metadata={"format": "pt"})
                except Exception as e:  # its own error type, also for I/O errors
                    os_error = _os_error(e, data)
                    if os_error is None:
                        raise
                    raise os_error from e
                file = {"name": data.name, **_sync_and_hash(data)}
            entries[name] = {"skeleton": skeleton, "file": file}
        body: dict[str, Any] = {
            "format": "rlloop-checkpoint", "format_version": FORMAT_VERSION,
            "created": datetime.now(UTC).isoformat(), "rlloop_version": rlloop_version(),
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


def _os_error(exc: Exception, file: Path) -> OSError | None:
    """The ``OSError`` (e.g. a full disk) that a safetensors error names as ``(os error N)``."""
    match = re.search(r"\(os error (\d+)\)", str(exc))
    if match is None:
        return None
    code = int(match[1])
    return OSError(code, os.strerror(code), str(file))


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
    path: str | Path, components: Mapping[str, Any], *, metadata: Mapping[str, Any] | None = None,
    replace_incomplete: bool = False,
) -> Path:
    """Atomically write a checkpoint at ``path``, replacing a checkpoint already there.

    For fixed names such as ``<run>/best``. At every instant either the old or the new
    checkpoint is complete (see the module doc); an existing non-checkpoint is never replaced,
    except, with ``replace_incomplete``, a directory without a manifest: what an interrupted
    copy of a run leaves under a name the caller owns; and a symbolic link there, which is
    removed (never followed), with a warning.
    """
    path = Path(path)
    if path.parent.is_dir():
        _clean_leftovers(path.parent)
    if replace_incomplete and path.is_symlink():
        # A link planted at a name the run will reach (checkpoints/<next step>): refusing it
        # stopped the run there on every resume; replacing it leaves its target alone.
        _log.warning("replacing %s: it is a symbolic link (to %s), not a checkpoint; its "
                     "target is left alone", path, os.readlink(path))
        path.unlink()
    if (path.exists() or path.is_symlink()) and not is_checkpoint(path):
        incomplete = path.is_dir() and not path.is_symlink() and not (path / MANIFEST).exists()
        if not (replace_incomplete and incomplete):
            raise FileExistsError(f"{path} exists and is not a checkpoint; refusing to replace it")
        _log.warning("replacing %s: it has no %s (an incomplete checkpoint)", path, MANIFEST)
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


def _clean_leftovers(root: Path) -> None:
    """Remove temp dirs of dead processes; restore a checkpoint whose replace was interrupted."""
    for entry in root.iterdir():
        match = _LEFTOVER_RE.fullmatch(entry.name)
        if not match or not entry.is_dir() or pid_alive(int(match["pid"])):
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

# Reads that lose a race with save_replacing() start over; a writer replacing the same
# checkpoint more often than a read takes is the only way to use them all up.
_READ_ATTEMPTS = 20


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
    """Read ``path``, again if a concurrent :func:`save_replacing` swapped it mid-read.

    A reader racing a replace can take the manifest from the old checkpoint and a data file
    from the new one; the hashes catch that, and a manifest that changed under the reader
    tells it apart from real damage. So a reader sees the old or the new checkpoint, whole.
    """
    for attempt in range(1, _READ_ATTEMPTS + 1):
        seen: list[bytes] = []
        try:
            return _read_once(path, expected, decode, seen)
        except (CheckpointCorruptError, CheckpointNotFoundError):
            if attempt == _READ_ATTEMPTS or not _replaced_since(path, seen):
                raise
            time.sleep(0.001 * attempt)  # a replace without renameat2 is two renames apart
    raise AssertionError("unreachable")


def _replaced_since(path: Path, seen: list[bytes]) -> bool:
    """Whether ``path`` holds another manifest than ``seen`` (or is being replaced)."""
    try:
        now = (path / MANIFEST).read_bytes()
    except OSError:  # gone: replaced without an exchange, between its two renames
        return _replace_in_progress(path)
    return not seen or now != seen[0]


def _replace_in_progress(path: Path) -> bool:
    """A replace without an exchange has moved the old ``path`` aside (``.<name>.old-...``)."""
    if not path.parent.is_dir():
        return False
    for entry in path.parent.iterdir():
        match = _LEFTOVER_RE.fullmatch(entry.name)
        if match and match["name"] == path.name and match["kind"] == "old":
            return True
    return False


def _read_once(path: Path, expected: Iterable[str] | None, decode: bool,
               seen: list[bytes]) -> Checkpoint:
    if not is_checkpoint(path):
        hint = " (rlloop never loads pickled .pt files)" if path.is_file() else ""
        raise CheckpointNotFoundError(
            f"{path / MANIFEST}: not found; {path} is not a committed rlloop checkpoint "
            f"directory{hint}. Check the path, or use CheckpointManager.latest()."
        )
    body = _read_manifest(path / MANIFEST, seen)
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


def _read_manifest(file: Path, seen: list[bytes] | None = None) -> dict[str, Any]:
    try:
        raw = file.read_bytes()
    except FileNotFoundError:
        raise CheckpointNotFoundError(f"{file}: not found; the checkpoint was removed") from None
    if seen is not None:
        seen.append(raw)
    try:
        body = json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise _corrupt(file, f"is not valid JSON ({e})") from e
    version = body.get("format_version") if isinstance(body, dict) else None
    if type(version) is not int or version < 1:
        raise _corrupt(file, "has no valid format_version")
    if version > FORMAT_VERSION:
        raise CheckpointVersionError(
            f"{file}: format_version {version} was written by a newer rlloop; this rlloop "
            f"({rlloop_version()}) reads format_version <= {FORMAT_VERSION}. Upgrade rlloop."
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
    # One open file for the size, the hash and the tensors: reopening by name could parse
    # another file than the one hashed if the checkpoint is replaced in between.
    try:
        f = open(file, "rb")  # noqa: SIM115 (closed below; the error must name the file)
    except FileNotFoundError:
        raise _corrupt(file, "is missing (manifest.json lists it)") from None
    with f:
        size = os.fstat(f.fileno()).st_size
        if size != info["bytes"]:
            raise _corrupt(file, f"has {size} bytes, manifest.json says {info['bytes']} "
                           "(truncated?)")
        if not decode:
            digest, data = hashlib.file_digest(f, "sha256").hexdigest(), b""
        else:
            data = f.read()
            digest = hashlib.sha256(data).hexdigest()
    if digest != info["sha256"]:
        raise _corrupt(file, "fails its sha256 check (contents changed)")
    if not decode:
        return {}
    try:  # the tensors own their memory: nothing maps a file that may change or go away
        return safetensors.torch.load(data)
    except Exception as e:  # safetensors raises its own error type for any malformed input
        raise _corrupt(file, f"is not a valid safetensors file ({e})") from e
