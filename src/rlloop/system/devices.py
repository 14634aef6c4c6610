"""Where a run's tensors live: the ``device`` setting, host-to-device transfers, generators.

A run names one device (``auto``, ``cpu``, ``cuda``, ``cuda:N`` or ``mps``) and everything
it owns lives there: native envs, rollout and replay storage, modules, optimisers,
normalisers and random generators. Host-side envs (Gymnasium, PettingZoo) hand their
batch over once per step through :func:`to_device`.

``auto`` picks CUDA when ``torch.cuda.is_available()``, else the CPU. It never picks MPS:
MPS has no float64, which rlloop's running statistics use, so ``mps`` is opt-in.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import logging
import os
import platform
import shutil
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
from torch import Tensor, nn

from rlloop.errors import ConfigError
from rlloop.system.device_names import DEVICE_CHOICES as DEVICE_CHOICES
from rlloop.system.device_names import check_device_name as check_device_name

_log = logging.getLogger(__name__)

HOST = torch.device("cpu")

M = TypeVar("M", bound=nn.Module)


def resolve_device(name: str | torch.device) -> torch.device:
    """The ``torch.device`` a setting stands for on this machine.

    Raises:
        ConfigError: a malformed name, or a device this machine does not have.
    """
    if isinstance(name, torch.device):
        name = str(name)
    check_device_name(name)
    if name == "auto":
        return torch.device("cuda") if torch.cuda.is_available() else HOST
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"device {name!r} was asked for but this machine has no CUDA "
                              "(torch.cuda.is_available() is False); use device=cpu or auto")
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise ConfigError(f"device {name!r} does not exist: this machine has {count} CUDA "
                              f"device(s), cuda:0..cuda:{count - 1}")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"device {name!r} was asked for but MPS is not available here; "
                          "use device=cpu or auto")
    return device


#: glibc's ``mallopt`` parameters (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


@functools.cache
def keep_freed_host_memory() -> bool:
    """Have glibc's malloc keep freed memory for the process's next allocations; returns
    whether it took (False off glibc). Once per process.

    By default glibc serves every block over 128 KiB-32 MiB with its own ``mmap`` and
    returns it to the kernel when freed, and trims the heap's free top: a training loop
    that allocates the same large tensors every iteration then has the kernel zero their
    pages again each time (a third of a large-batch PPO update on a CPU). Serving blocks
    up to 1 GiB from the heap and never trimming it keeps that memory in the process:
    the resident size stays at its peak instead of rising and falling every iteration.
    """
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return bool(mallopt(_M_MMAP_THRESHOLD, 1 << 30)) and bool(
        mallopt(_M_TRIM_THRESHOLD, 2**31 - 1))


def stats_dtype(device: torch.device) -> torch.dtype:
    """Dtype of running statistics (returns, normalisers): float64, or float32 on MPS,
    which has no float64."""
    return torch.float32 if device.type == "mps" else torch.float64


def to_device(x: Tensor, device: torch.device) -> Tensor:
    """Move a tensor to ``device``: from the host to CUDA through pinned memory without
    blocking the host (the caching host allocator keeps the pinned block alive until the
    copy ran); a no-op where it already is."""
    if device.type == "cuda" and x.device.type == "cpu":
        return x.pin_memory().to(device, non_blocking=True)
    return x.to(device)


def arrays_to_device(arrays: Sequence[np.ndarray], device: torch.device) -> list[Tensor]:
    """Host arrays as tensors on ``device``, each of its own dtype (uint8 frames stay
    uint8): views of the arrays on the CPU; elsewhere the arrays' bytes in one transfer,
    each array's segment aligned to 8 bytes and viewed as its dtype on the device, so a
    host env's step crosses once."""
    if device.type == "cpu":
        return [torch.from_numpy(a) for a in arrays]
    return packed_to_device(arrays, device)


def packed_to_device(arrays: Sequence[np.ndarray], device: torch.device) -> list[Tensor]:
    """:func:`arrays_to_device`'s one transfer, on any device (copies on the CPU)."""
    contiguous = [np.ascontiguousarray(a) for a in arrays]
    starts, size = [], 0
    for a in contiguous:
        starts.append(size)
        size += -(-a.nbytes // _ALIGN) * _ALIGN
    # (at least one aligned segment: a zero-byte buffer cannot be viewed as another dtype)
    packed = np.zeros(max(size, _ALIGN), np.uint8)
    for a, start in zip(contiguous, starts, strict=True):
        packed[start:start + a.nbytes] = a.reshape(-1).view(np.uint8)
    moved = to_device(torch.from_numpy(packed), device)
    return [moved[start:start + a.nbytes].view(_torch_dtype(a.dtype)).view(np.shape(raw))
            for raw, a, start in zip(arrays, contiguous, starts, strict=True)]


#: Byte alignment of each array's segment in :func:`arrays_to_device`'s one transfer
#: (enough for any dtype's ``Tensor.view``).
_ALIGN = 8


def _torch_dtype(dtype: np.dtype) -> torch.dtype:
    return torch.from_numpy(np.empty(0, dtype)).dtype


def move_to(value: Any, device: torch.device) -> Any:
    """``value`` with every tensor inside it (dataclasses, mappings, lists and tuples are
    searched) moved to ``device`` by :func:`to_device`; other leaves are kept."""
    if isinstance(value, Tensor):
        return to_device(value, device)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.replace(value, **{f.name: move_to(getattr(value, f.name), device)
                                             for f in dataclasses.fields(value) if f.init})
    if isinstance(value, Mapping):
        return {k: move_to(v, device) for k, v in value.items()}
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a NamedTuple
        return type(value)(*(move_to(v, device) for v in value))
    if isinstance(value, list | tuple):
        return type(value)(move_to(v, device) for v in value)
    return value


def build_module(factory: Callable[[], M], device: torch.device) -> M:
    """``factory()`` built on the host with torch's CPU generator, then moved to ``device``:
    one seed gives the same initial weights on every device."""
    with torch.device(HOST):
        module = factory()
    return module.to(device)


def new_generator(device: torch.device, seed: int) -> torch.Generator:
    """A ``torch.Generator`` on ``device`` seeded with ``seed``."""
    return torch.Generator(device=device).manual_seed(seed)


def set_generator_state(generator: torch.Generator, state: Any, fallback_seed: int) -> None:
    """Restore a generator's saved state; if it was saved from another kind of device
    (CUDA's Philox and the CPU's Mersenne Twister keep states of different sizes), seed
    ``fallback_seed`` instead, with a warning: the run goes on, no longer bit-exact."""
    saved = torch.as_tensor(state, dtype=torch.uint8, device=HOST)
    if saved.numel() == generator.get_state().numel():
        generator.set_state(saved)
        return
    _log.warning("a random generator was saved on another kind of device than %s; it is "
                 "seeded afresh, so this resume is not bit-exact", generator.device)
    generator.manual_seed(fallback_seed)


#: CPU flags of bfloat16 matrix instructions: x86's AVX512-BF16 and AMX, Arm's BF16.
BFLOAT16_CPU_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})


def cpu_has_bfloat16_units(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool | None:
    """Whether the CPU computes bfloat16 products in hardware (:data:`BFLOAT16_CPU_FLAGS`
    among its ``flags``/``Features``); ``None`` where ``cpuinfo`` cannot tell (no such
    file, as on macOS and Windows, or no flags in it)."""
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    flags: set[str] = set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags.update(value.split())
    return bool(flags & BFLOAT16_CPU_FLAGS) if flags else None


@functools.cache
def warn_if_bfloat16_is_emulated() -> None:
    """Warn once per process where a bfloat16 CNN computes on a CPU without bfloat16
    instructions: oneDNN then converts every product through float32, and a Nature CNN's
    forward and backward pass of 256 frames ran 11x slower than in float32 (3.06 s against
    0.27 s on an AVX2-only AMD EPYC core)."""
    if cpu_has_bfloat16_units() is False:
        warnings.warn("cnn_precision=bfloat16 on a CPU without bfloat16 instructions "
                      "(AVX512-BF16, AMX or Arm BF16): its convolutions are emulated, about "
                      "10x slower than float32; set <algo>.cnn_precision=float32",
                      stacklevel=3)


def check_cpu_compiler(algo: str) -> None:
    """``compile=true`` on a CPU needs the C++ compiler torch.compile builds its kernels
    with (``$CXX``, else g++; clang++ on macOS): say so before anything is built, not at the
    first update."""
    cxx = os.environ.get("CXX") or ("clang++" if sys.platform == "darwin" else "g++")
    if shutil.which(cxx) is None:
        raise ConfigError(f"{algo}.compile=true on the CPU needs a C++ compiler: torch.compile "
                          f"builds its kernels with {cxx}, which is not on PATH; install it "
                          "(e.g. apt install g++), point CXX at one, or set compile=false")
