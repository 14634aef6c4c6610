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
A load that loses a race with a replace (its manifest changed while it read) starts over,
so readers see the old or the new checkpoint, never a mix; each data file is hashed and
parsed from one read.

The package is split by concern: ``format`` (errors, values <-> JSON skeleton +
tensors), ``store`` (atomic writes, verified reads), ``manager`` (numbered checkpoints
with rotation) and ``rng`` (global RNG state).

May import: ``rlloop.errors`` and ``system`` only: a checkpoint is data, read without
the code that made it.
"""

from __future__ import annotations

from rlloop.checkpoint.format import (
    FORMAT_VERSION,
    MANIFEST,
    Checkpoint,
    CheckpointCorruptError,
    CheckpointMismatchError,
    CheckpointNotFoundError,
    CheckpointVersionError,
    restoring,
)
from rlloop.checkpoint.manager import CheckpointManager
from rlloop.checkpoint.rng import capture_rng_state, restore_rng_state
from rlloop.checkpoint.store import (
    is_checkpoint,
    load_checkpoint,
    save_checkpoint,
    save_replacing,
    verify_checkpoint,
)
from rlloop.errors import CheckpointError

__all__ = [
    "FORMAT_VERSION",
    "MANIFEST",
    "Checkpoint",
    "CheckpointCorruptError",
    "CheckpointError",
    "CheckpointManager",
    "CheckpointMismatchError",
    "CheckpointNotFoundError",
    "CheckpointVersionError",
    "capture_rng_state",
    "is_checkpoint",
    "load_checkpoint",
    "restore_rng_state",
    "restoring",
    "save_checkpoint",
    "save_replacing",
    "verify_checkpoint",
]
