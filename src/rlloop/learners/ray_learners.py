"""Learner ranks 1..L-1 as Ray actors (RLlib's layout), on the Ray instance the env runners
use. Imported only when Ray is in use for the run.

Each rank is one actor reserving ``ray.num_cpus_per_learner`` CPUs and
``ray.num_gpus_per_learner`` GPUs; it runs :func:`~rlloop.learners.learner_group.serve_rank`
as one long task. Rank 0 (the training process) watches it through :class:`ActorMember`,
which reads like a ``multiprocessing.Process``, so a rank that dies fails the group as a
spawned one does (``LearnerGroupError``, then ``max_learner_restarts``).

The rendezvous binds to this node's Ray address: 127.0.0.1 for the local instance rlloop
starts (so nothing listens on a public interface), the node's cluster address when
connected to a cluster (the actors may be placed on other machines and must reach it).
"""

from __future__ import annotations

import os
import signal
import uuid
from typing import Any

import ray

from rlloop.learners.learner_group import START_TIMEOUT_S, LearnerSpec, Member, serve_rank
from rlloop.learners.process_group import LearnerGroupError

#: Actor names: ``rlloop-learner-<group>-<rank>`` (``ray list actors`` shows whose they are).
NAME_PREFIX = "rlloop-learner-"


class RankActor:
    """One learner rank in a Ray worker process."""

    def pid(self) -> int:
        return os.getpid()

    def serve(self, rank: int, world_size: int, host: str, port: int,
              spec: LearnerSpec) -> None:
        serve_rank(rank, world_size, port, spec, host)


class ActorMember:
    """A rank's actor behind the ``multiprocessing.Process`` interface rank 0 watches."""

    def __init__(self, actor: Any, pid: int, done: Any) -> None:
        self.actor, self._pid, self.done = actor, pid, done
        self._code: int | None = None

    @property
    def pid(self) -> int:
        return self._pid

    @property
    def exitcode(self) -> int | None:
        if self._code is None and ray.wait([self.done], timeout=0)[0]:
            try:
                ray.get(self.done)
                self._code = 0
            except ray.exceptions.RayActorError:
                # Ray does not say how an actor's process ended (ray.kill, a signal, OOM,
                # a lost node): a dead actor reads as a killed process.
                self._code = -int(signal.SIGKILL)
            except ray.exceptions.RayError:
                self._code = 1  # the rank raised
            ray.kill(self.actor)  # an actor outlives its task: free its CPUs and GPUs
        return self._code

    def join(self, timeout: float | None = None) -> None:
        ray.wait([self.done], timeout=timeout)

    def kill(self) -> None:
        ray.kill(self.actor, no_restart=True)


def node_address() -> str:
    """This process's node address in Ray (127.0.0.1 on rlloop's local instance)."""
    node_id = ray.get_runtime_context().get_node_id()
    return next(str(n["NodeManagerAddress"]) for n in ray.nodes() if n["NodeID"] == node_id)


class RayLauncher:
    """Starts ranks 1..L-1 as actors (a ``learner_group.Launcher``)."""

    def __init__(self, num_cpus: float, num_gpus: float) -> None:
        self.num_cpus, self.num_gpus = num_cpus, num_gpus
        self.host = node_address()

    def start(self, spec: LearnerSpec, world_size: int, port: int) -> list[Member]:
        actor_cls: Any = ray.remote(RankActor)
        group = uuid.uuid4().hex[:8]
        # Handles, typed loosely: Ray's stubs do not know the actor's remote methods.
        actors: list[Any] = [actor_cls.options(
            name=f"{NAME_PREFIX}{group}-{rank}", num_cpus=self.num_cpus,
            num_gpus=self.num_gpus, max_restarts=0, max_task_retries=0).remote()
            for rank in range(1, world_size)]
        members: list[Member] = []
        try:
            try:
                pids = ray.get([a.pid.remote() for a in actors], timeout=START_TIMEOUT_S)
            except ray.exceptions.GetTimeoutError:
                raise LearnerGroupError(
                    f"Ray placed no learner actor within {START_TIMEOUT_S:.0f} s (each asks "
                    f"for {self.num_cpus} CPUs and {self.num_gpus} GPUs); lower "
                    "ray.num_cpus_per_learner / ray.num_gpus_per_learner or add nodes"
                    ) from None
            for rank, (actor, pid) in enumerate(zip(actors, pids, strict=True), 1):
                done = actor.serve.remote(rank, world_size, self.host, port, spec)
                members.append(ActorMember(actor, pid, done))
        except BaseException:
            for actor in actors:
                ray.kill(actor, no_restart=True)
            raise
        return members
