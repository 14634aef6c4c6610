"""Several learners as one: the process group, the gradient all-reduce, the wire format.

``num_learners=L`` runs L learner ranks. Rank 0 lives in the training process beside the
env runner; ranks 1..L-1 are worker processes (:mod:`rlloop.learners.learner_group`). Every
rank holds the same modules and optimisers and takes its contiguous shard of every
minibatch; after ``backward`` the gradients are all-reduced, each weighted by its shard's
share of the minibatch, so every rank steps with the gradient of the minibatch's mean loss:
the update one learner would make on the whole minibatch (to float rounding). Clipping,
the non-finite guard and the optimiser then see the same reduced gradient on every rank, so
the replicas never drift apart. Statistics are reduced the same way (weighted means).

Rank 0 drives the others with commands broadcast over the process group (gloo on CPU, NCCL
on CUDA): a JSON header and flat tensors per dtype, no pickling, so a process that reaches
the loopback rendezvous cannot make a rank run code.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import socket
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

import psutil
import torch
import torch.distributed as dist
from torch import Tensor

from rlloop.data.batch import TensorBatch
from rlloop.errors import RlloopError
from rlloop.learners.learner import Learner

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


def shard_bounds(n: int, rank: int, world_size: int) -> tuple[int, int]:
    """Rank ``rank``'s contiguous rows ``[start, stop)`` of ``n`` (sizes differ by <= 1)."""
    return n * rank // world_size, n * (rank + 1) // world_size


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


# ---- the learner side --------------------------------------------------------------------
class Link(Protocol):
    """Rank 0's line to the other ranks (a rank > 0 has none)."""

    def send(self, op: str, payload: Mapping[str, Any]) -> None:
        """Broadcast a command; the other ranks run it through :meth:`DataParallel.handle`."""
        ...

    def guard(self) -> AbstractContextManager[None]:
        """Turns a broken group (a rank died) into :class:`LearnerGroupError`, and stops
        every rank."""
        ...

    def close(self) -> None:
        """Stop every rank and leave the process group."""
        ...


class DataParallel(Learner[Any]):
    """Mixin for an algorithm's learner: ``class X(DataParallel, PPOLearner)``.

    Every rank runs the same calls in the same order; rank 0 (whose ``link`` is set)
    first sends each one to the others. Subclasses route their algorithm's update through
    :meth:`shard` and :meth:`reduce_stats` and may normalise whole minibatches in
    :meth:`prepare_minibatch` before they are split.
    """

    group: GroupInfo
    link: Link | None
    comm_device: torch.device
    _weights: dict[str, float]

    def join(self, group: GroupInfo, link: Link | None, comm_device: torch.device) -> None:
        self.group, self.link, self.comm_device = group, link, comm_device
        self._weights = {}

    # ---- sharding and reduction --------------------------------------------------------
    def shard(self, module_id: str, n: int) -> tuple[int, int]:
        """This rank's rows of an ``n``-row minibatch; sets the gradient weight. A rank with
        no rows computes on row 0 with weight 0, so that every rank joins every collective."""
        start, stop = shard_bounds(n, self.group.rank, self.group.world_size)
        self._weights[module_id] = (stop - start) / n
        return (start, stop) if stop > start else (0, 1)

    def reduce_gradients(self) -> None:
        grads: list[Tensor] = []
        weights: list[float] = []
        seen: set[int] = set()
        for (module_id, _), optim in self._optims.items():
            for p in optim.params:
                if p.grad is not None and id(p) not in seen:
                    seen.add(id(p))
                    grads.append(p.grad)
                    weights.append(self._weights.get(module_id, 1.0 / self.group.world_size))
        if not grads:
            return
        flat = torch.cat([g.reshape(-1) * w for g, w in zip(grads, weights, strict=True)])
        dist.all_reduce(flat)
        offset = 0
        for g in grads:
            g.copy_(flat[offset: offset + g.numel()].view_as(g))
            offset += g.numel()

    def reduce_stats(self, stats: Mapping[str, Tensor], weight: float) -> dict[str, Tensor]:
        """Weighted means across ranks of per-sample means (constants stay as they are)."""
        keys = sorted(stats)
        if not keys:
            return {}
        values = torch.stack([stats[k].detach().reshape(()).to(self.comm_device, torch.float64)
                              for k in keys]) * weight
        dist.all_reduce(values)
        return {k: values[i].to(stats[k].device, stats[k].dtype)
                for i, k in enumerate(keys)}

    # ---- the Learner's update path, sharded -------------------------------------------
    def update_minibatch(self, batch: Mapping[str, Any]) -> dict[str, Tensor]:
        shards = {}
        self._minibatch_rows: dict[str, int] = {}
        for module_id, b in batch.items():
            b = self.prepare_minibatch(module_id, b)
            self._minibatch_rows[module_id] = len(b)
            shards[module_id] = b.rows(*self.shard(module_id, len(b)))
        shards = {m: b for m, b in shards.items() if self._updatable(m)}
        if not shards:
            return {}
        self._reduced_losses: dict[str, Tensor] = {}
        stats = self.gradient_step(shards)
        for module_id, loss in self._reduced_losses.items():
            key = self._stat_key(module_id, "losses/total")
            if key in stats:  # absent on every rank when the update was skipped
                stats[key] = loss
        return stats

    def micro_batches(self, mb: Mapping[str, Any]) -> int:
        return 1  # every rank must join the same collectives: one pass per shard

    def agreed(self, finite: Tensor) -> Tensor:
        """Finite on every rank: one rank's loss may overflow on its shard alone, and
        every rank must skip (or take) the same step, or the copies drift apart."""
        flag = finite.to(self.comm_device, torch.float32).reshape(1)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return flag.to(finite.device).bool().reshape(())

    def samples_trained(self, module_id: str, batch: Any) -> int:
        # The whole minibatch the ranks shared, not this rank's shard.
        return self._minibatch_rows.get(module_id, len(batch))

    def compute_losses(self, batch: Mapping[str, Any], fwd_out: Mapping[str, Any]
                       ) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        losses, stats = super().compute_losses(batch, fwd_out)
        weight = next(iter(self._weights.values()), 1.0 / self.group.world_size)
        # The losses travel with the stats: one all-reduce for both.
        marked = {**stats, **{f"\0{m}": loss for m, loss in losses.items()}}
        reduced = self.reduce_stats(marked, weight)
        self._reduced_losses = {m: reduced.pop(f"\0{m}") for m in losses}
        return losses, reduced

    def update_from_batch(self, batch: Mapping[str, Any], *, num_epochs: int = 1,
                          minibatch_size: int | None = None,
                          shuffle_batch_per_epoch: bool = True,
                          generator: torch.Generator | None = None,
                          stop: Callable[[dict[str, Tensor]], bool] | None = None,
                          env_steps: int | None = None) -> dict[str, float]:
        if self.link is None:
            return super().update_from_batch(
                batch, num_epochs=num_epochs, minibatch_size=minibatch_size,
                shuffle_batch_per_epoch=shuffle_batch_per_epoch, generator=generator,
                stop=stop, env_steps=env_steps)
        with self.link.guard():
            self.link.send("update_from_batch", {
                "batch": dict(batch), "num_epochs": num_epochs,
                "minibatch_size": minibatch_size, "shuffle": shuffle_batch_per_epoch,
                "generator": None if generator is None else generator.get_state(),
                "env_steps": self.env_steps if env_steps is None else env_steps,
                "stop": stop is not None})
            synced = None if stop is None else self.synced_stop(stop)
            return super().update_from_batch(
                batch, num_epochs=num_epochs, minibatch_size=minibatch_size,
                shuffle_batch_per_epoch=shuffle_batch_per_epoch, generator=generator,
                stop=synced, env_steps=env_steps)

    def synced_stop(self, stop: Callable[[dict[str, Tensor]], bool] | None
                    ) -> Callable[[dict[str, Tensor]], bool]:
        """Rank 0's ``stop`` decision, broadcast after every minibatch (``None``: receive)."""
        def decide(stats: dict[str, Tensor]) -> bool:
            return broadcast_flag(stop(stats) if stop is not None else False,
                                  self.comm_device)
        return decide

    # ---- commands on ranks > 0 ------------------------------------------------------------
    def handle(self, op: str, payload: dict[str, Any]) -> None:
        """Run the command rank 0 sent (a subclass adds its algorithm's own)."""
        if op == "update_from_batch":
            self.update_from_batch(
                payload["batch"], num_epochs=payload["num_epochs"],
                minibatch_size=payload["minibatch_size"],
                shuffle_batch_per_epoch=payload["shuffle"],
                generator=self.generator_from(payload["generator"]),
                stop=self.synced_stop(None) if payload["stop"] else None,
                env_steps=payload["env_steps"])
        elif op == "set_state":
            self.set_state(payload["state"])
        elif op == "report":
            self.report(payload["rank"])
        else:
            raise LearnerGroupError(f"unknown learner command {op!r}")

    def generator_from(self, state: Tensor | None) -> torch.Generator | None:
        """A generator on the modules' device in rank 0's generator's ``state``."""
        if state is None:
            return None
        device = next(iter(self.modules.parameters())).device
        generator = torch.Generator(device=device)
        generator.set_state(state.cpu())
        return generator

    def report(self, rank: int) -> dict[str, Any]:
        """Rank ``rank``'s module weights, on every rank (tests check the replicas)."""
        mine = self.get_state(components="module") if self.group.rank == rank else None
        return broadcast_message(mine, self.comm_device, src=rank)  # type: ignore[no-any-return]

    def state_of_rank(self, rank: int) -> dict[str, Any]:
        """On rank 0: ask rank ``rank`` for its module weights."""
        assert self.link is not None, "only rank 0 asks"
        with self.link.guard():
            self.link.send("report", {"rank": rank})
            return self.report(rank)

    # ---- state ---------------------------------------------------------------------------
    def sync_state(self) -> dict[str, Any]:
        """What every rank must hold equal: the learner's state but its metrics."""
        return self.get_state(not_components="metrics_logger")

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restore ``state`` here, then (rank 0) on every other rank."""
        super().set_state(state)
        self.broadcast_state()

    def broadcast_state(self) -> None:
        """On rank 0: make every rank's modules, optimisers and counters equal to ours."""
        if self.link is not None:
            with self.link.guard():
                self.link.send("set_state", {"state": self.sync_state()})

    def close(self) -> None:
        super().close()
        link, self.link = self.link, None
        if link is not None:
            link.close()
