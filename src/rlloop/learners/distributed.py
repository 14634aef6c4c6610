"""Several learners as one: each rank's shard of a minibatch, the gradient all-reduce.

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
the loopback rendezvous cannot make a rank run code. The group and its wire format are
:mod:`rlloop.learners.process_group`; this module is the learners' side.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import Tensor

from rlloop.learners.learner import Learner
from rlloop.learners.process_group import (
    GroupInfo,
    LearnerGroupError,
    broadcast_flag,
    broadcast_message,
)


def shard_bounds(n: int, rank: int, world_size: int) -> tuple[int, int]:
    """Rank ``rank``'s contiguous rows ``[start, stop)`` of ``n`` (sizes differ by <= 1)."""
    return n * rank // world_size, n * (rank + 1) // world_size


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
