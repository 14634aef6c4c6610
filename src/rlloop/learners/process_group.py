"""The learner ranks' process group and wire format: rendezvous on the loopback, and
commands broadcast as a JSON header plus flat tensors per dtype.

Nothing here is pickled, so a process that reaches the loopback rendezvous cannot make a
rank run code; a rank that dies or hangs becomes :class:`LearnerGroupError` within
``GROUP_TIMEOUT_S``. The learners that use the group are :mod:`rlloop.learners.distributed`.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import psutil
import torch
import torch.distributed as dist
from torch import Tensor

from rlloop.data.batch import TensorBatch
from rlloop.errors import RlloopError

LOOPBACK = "127.0.0.1"


#: How long a collective waits for a rank before it gives up (a rank that dies closes its
#: sockets and fails the collective at once; this bounds a rank that hangs).
GROUP_TIMEOUT_S = 300.0


#: The variables ``torchrun`` sets for every rank; when all are present the group uses them.
TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


class LearnerGroupError(RlloopError, RuntimeError):
    """A learner rank died or the process group broke; the run can resume from its newest
    checkpoint (``max_learner_restarts`` does that by itself)."""


@dataclass(frozen=True)
class GroupInfo:
    """This process's place in the learner group."""

    rank: int
    world_size: int
    backend: str


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def listen_loopback(host: str = LOOPBACK) -> socket.socket:
    """A listening socket on ``host`` (127.0.0.1 unless the ranks run on other machines)
    with a free port, for the rendezvous store: torch's own store would listen on every
    interface."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((host, 0))
    sock.listen(128)
    return sock


def _pin_gloo_to_loopback() -> None:
    """Gloo listens on the interface its host name resolves to unless told otherwise."""
    if "GLOO_SOCKET_IFNAME" in os.environ:
        return
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == LOOPBACK for a in addrs):
            os.environ["GLOO_SOCKET_IFNAME"] = name
            return


def torchrun_rank() -> GroupInfo | None:
    """This process's rank when ``torchrun`` (or any launcher setting its variables) started
    it, else None."""
    if not all(v in os.environ for v in TORCHRUN_VARS):
        return None
    return GroupInfo(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), "")


def make_store(rank: int, world_size: int, port: int, listen_fd: int | None = None,
               timeout_s: float = GROUP_TIMEOUT_S, host: str = LOOPBACK) -> dist.TCPStore:
    """The rendezvous: a TCP store on ``host`` that rank 0 serves on ``listen_fd``."""
    return dist.TCPStore(host, port, world_size, is_master=rank == 0,
                         timeout=datetime.timedelta(seconds=timeout_s),
                         wait_for_workers=False,
                         master_listen_fd=listen_fd if rank == 0 else None)


def init_group(rank: int, world_size: int, backend: str, store: dist.Store | None,
               timeout_s: float = GROUP_TIMEOUT_S, loopback: bool = True) -> GroupInfo:
    """Join the default process group through ``store``, or without one through
    ``torchrun``'s ``MASTER_ADDR``/``MASTER_PORT``."""
    timeout = datetime.timedelta(seconds=timeout_s)
    if store is None:
        if backend == "gloo" and os.environ.get("MASTER_ADDR") in (LOOPBACK, "localhost"):
            _pin_gloo_to_loopback()
        dist.init_process_group(backend, init_method="env://", rank=rank,
                                world_size=world_size, timeout=timeout)
    else:
        # Ranks on other machines (Ray actors on a cluster) reach gloo on the interface
        # the host name resolves to.
        if backend == "gloo" and loopback:
            _pin_gloo_to_loopback()
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                                timeout=timeout)
    return GroupInfo(rank, world_size, backend)


def destroy_group() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


# ---- the wire format -------------------------------------------------------------------
def _batch_types() -> dict[str, type]:
    found: dict[str, type] = {}
    todo = list(TensorBatch.__subclasses__())
    while todo:
        cls = todo.pop()
        found[cls.__name__] = cls
        todo.extend(cls.__subclasses__())
    return found


def encode(obj: Any, tensors: list[Tensor]) -> Any:
    """``obj`` as JSON data, its tensors appended to ``tensors`` and named by index.

    Takes what learner states and batches are made of: dicts (any scalar keys), lists,
    tuples, tensors, scalars, and :class:`TensorBatch` dataclasses.
    """
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    if isinstance(obj, Tensor):
        tensors.append(obj)
        return {"t": len(tensors) - 1}
    if isinstance(obj, TensorBatch) and dataclasses.is_dataclass(obj):
        return {"b": type(obj).__name__,
                "f": {f.name: encode(getattr(obj, f.name), tensors)
                      for f in dataclasses.fields(obj)}}
    if isinstance(obj, Mapping):
        return {"d": [[encode(k, tensors), encode(v, tensors)] for k, v in obj.items()]}
    if isinstance(obj, list | tuple):
        return {"l" if isinstance(obj, list) else "u": [encode(v, tensors) for v in obj]}
    raise TypeError(f"cannot send a {type(obj).__name__} to the other learners")


def decode(data: Any, tensors: list[Tensor]) -> Any:
    if not isinstance(data, dict):
        return data
    if "t" in data:
        return tensors[data["t"]]
    if "b" in data:
        cls = _batch_types().get(data["b"])
        if cls is None:
            raise LearnerGroupError(f"unknown batch type {data['b']!r} in a learner message")
        return cls(**{k: decode(v, tensors) for k, v in data["f"].items()})
    if "d" in data:
        return {decode(k, tensors): decode(v, tensors) for k, v in data["d"]}
    items = [decode(v, tensors) for v in (data["l"] if "l" in data else data["u"])]
    return items if "l" in data else tuple(items)


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise LearnerGroupError(f"bad dtype {name!r} in a learner message")
    return dtype


def broadcast_message(obj: Any, device: torch.device, src: int = 0) -> Any:
    """Send ``obj`` from rank ``src`` to every rank; every rank returns it (on ``device``).

    Two broadcasts for the JSON header (length, bytes) and one per tensor dtype.
    """
    rank = dist.get_rank()
    tensors: list[Tensor] = []
    header = b""
    if rank == src:
        data = encode(obj, tensors)
        meta = [[str(t.dtype).removeprefix("torch."), list(t.shape)] for t in tensors]
        header = json.dumps({"data": data, "meta": meta}).encode()
    size = torch.tensor([len(header)], dtype=torch.int64, device=device)
    dist.broadcast(size, src)
    raw = (torch.frombuffer(bytearray(header), dtype=torch.uint8).to(device) if rank == src
           else torch.empty(int(size.item()), dtype=torch.uint8, device=device))
    dist.broadcast(raw, src)
    message = json.loads(bytes(raw.cpu().numpy()).decode())
    shapes = [(_dtype(d), torch.Size(s)) for d, s in message["meta"]]
    by_dtype: dict[torch.dtype, list[int]] = {}
    for i, (dtype, _) in enumerate(shapes):
        by_dtype.setdefault(dtype, []).append(i)
    out: list[Tensor] = [torch.empty(0)] * len(shapes)
    for dtype, index in by_dtype.items():
        wire = torch.uint8 if dtype == torch.bool else dtype  # gloo has no bool
        if rank == src:
            flat = torch.cat([tensors[i].detach().reshape(-1).to(device).view(wire)
                              for i in index])
        else:
            flat = torch.empty(sum(shapes[i][1].numel() for i in index), dtype=wire,
                               device=device)
        dist.broadcast(flat, src)
        offset = 0
        for i in index:
            n = shapes[i][1].numel()
            out[i] = flat[offset: offset + n].view(dtype).view(shapes[i][1]).clone()
            offset += n
    return decode(message["data"], out)


def broadcast_flag(value: bool, device: torch.device, src: int = 0) -> bool:
    flag = torch.tensor([int(value)], dtype=torch.int64, device=device)
    dist.broadcast(flag, src)
    return bool(flag.item())
