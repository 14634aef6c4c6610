"""The learner ranks as processes: started, watched and stopped by rank 0.

Rank 0 is the training process. Without a launcher it starts ranks 1..L-1 itself
(``multiprocessing`` spawn) and serves their rendezvous on 127.0.0.1; under ``torchrun``
every rank is already running and the group forms from the launcher's variables. A rank
that dies fails the collective rank 0 is in (or the liveness check before the next
command): :class:`~rlloop.learners.process_group.LearnerGroupError` names the rank and its
exit, and every other rank is stopped, so nothing is left running.

Other launchers fit the same shape (a :class:`Launcher`): something that runs
:func:`serve_rank` for ranks 1..L-1 and hands rank 0 handles with ``exitcode``, ``pid``,
``join`` and ``kill``; :mod:`rlloop.learners.ray_learners` starts them as Ray actors.
"""

from __future__ import annotations

import contextlib
import datetime
import itertools
import multiprocessing
import os
import signal
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist

from rlloop.errors import ConfigError
from rlloop.learners.distributed import DataParallel
from rlloop.learners.process_group import (
    GROUP_TIMEOUT_S,
    LOOPBACK,
    GroupInfo,
    LearnerGroupError,
    backend_for,
    broadcast_message,
    destroy_group,
    init_group,
    listen_loopback,
    make_store,
)
from rlloop.system.worker_loop import exit_with_parent

#: Seconds rank 0 waits for the other ranks to start (importing torch takes seconds on a
#: loaded machine).
START_TIMEOUT_S = 120.0
#: How long a rank > 0 waits for rank 0's next command: as long as a run may go without
#: an update (a slow env's warm-up or evaluation).
COMMAND_WAIT = datetime.timedelta(days=365)


@dataclass(frozen=True)
class LearnerSpec:
    """What a rank needs to build its learner; sent once to a spawned rank (picklable).

    Attributes:
        build: A module-level function ``build(spec, group, device, link)`` returning the
            rank's :class:`DataParallel` learner (``link`` is None on ranks > 0).
        config: The algorithm's config.
        env_spec: The env's spaces.
    """

    build: Callable[..., DataParallel]
    config: Any
    env_spec: Any
    device: str
    on_nonfinite: str
    seed: int
    torch_threads: int
    timeout_s: float = GROUP_TIMEOUT_S
    """How long one collective may wait for a rank that is alive but stuck."""


class Member(Protocol):
    """A rank > 0 as rank 0 sees it (a ``multiprocessing.Process``, or a wrapped actor)."""

    @property
    def exitcode(self) -> int | None: ...
    @property
    def pid(self) -> int | None: ...
    def join(self, timeout: float | None = None) -> None: ...
    def kill(self) -> None: ...


class Launcher(Protocol):
    """Starts ranks 1..L-1 somewhere else than in spawned processes (Ray actors)."""

    @property
    def host(self) -> str:
        """The address rank 0's rendezvous binds to: one every rank can reach."""
        ...

    def start(self, spec: LearnerSpec, world_size: int, port: int) -> list[Member]:
        """Start ranks 1..world_size-1, each running :func:`serve_rank` (not waiting for
        them to join), and return their handles in rank order."""
        ...


def rank_device(device: str, rank: int) -> torch.device:
    """Rank ``rank``'s device: one GPU per rank on CUDA (``cuda:rank`` modulo the count)."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.device("cuda", rank % torch.cuda.device_count())
    return dev


def _exit_words(code: int | None) -> str:
    if code is None:
        return "stopped answering"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


class ProcessLink:
    """Rank 0's side of the group: commands out, members watched, everything stopped."""

    def __init__(self, members: Sequence[Member], comm_device: torch.device,
                 world_size: int) -> None:
        self.members = list(members)
        self.comm_device = comm_device
        self.world_size = world_size
        self.broken = False
        self.seq = 0

    def send(self, op: str, payload: Mapping[str, Any]) -> None:
        self._raise_if_dead()
        self._post({"op": op, **payload})

    def _post(self, message: Mapping[str, Any]) -> None:
        # Ranks > 0 wait for a command on the store, without a deadline, and only then
        # enter the broadcast: rank 0 may collect or evaluate for longer than a collective
        # may take (GROUP_TIMEOUT_S).
        self.seq += 1
        store = default_store()
        for rank in range(1, self.world_size):
            store.set(command_key(rank, self.seq), "1")
        broadcast_message(message, self.comm_device)

    def _dead(self) -> list[tuple[int, Member]]:
        return [(r, m) for r, m in enumerate(self.members, 1) if m.exitcode is not None]

    def _dead_within(self, wait_s: float) -> list[tuple[int, Member]]:
        deadline = time.monotonic() + wait_s
        while not (dead := self._dead()) and time.monotonic() < deadline:
            time.sleep(0.05)
        return dead

    def _raise_if_dead(self) -> None:
        dead = self._dead()
        if dead:
            rank, member = dead[0]
            raise LearnerGroupError(
                f"learner rank {rank} (pid {member.pid}) {_exit_words(member.exitcode)}; "
                "the learner group is stopped. Resume from the newest checkpoint with "
                "--resume, or set max_learner_restarts to do that by itself")

    @contextlib.contextmanager
    def guard(self) -> Iterator[None]:
        try:
            yield
        except LearnerGroupError:
            self.broken = True
            self.close()
            raise
        except RuntimeError as e:  # gloo and NCCL raise RuntimeError and subclasses
            # A killed rank's sockets close before its exit code can be read: wait for it.
            if not isinstance(e, dist.DistError) and not self._dead_within(5.0):
                raise
            self.broken = True
            try:
                self._raise_if_dead()
                raise LearnerGroupError(f"the learner group broke: {str(e).splitlines()[0]}; "
                                        "resume from the newest checkpoint") from e
            finally:
                self.close()

    def close(self) -> None:
        """Stop every rank (asking first, killing what does not stop) and leave the group."""
        if not self.broken and not self._dead() and dist.is_initialized():
            with contextlib.suppress(RuntimeError):
                self._post({"op": "close"})
        for member in self.members:
            member.join(timeout=0 if self.broken else 10)
            if member.exitcode is None:
                member.kill()
                member.join(timeout=10)
        self.members = []
        destroy_group()


def start_group(spec: LearnerSpec, world_size: int, device: torch.device,
                launcher: Launcher | None = None,
                ) -> tuple[GroupInfo, ProcessLink | None, Callable[[DataParallel], None]]:
    """Form the group from rank 0 (this process). Returns the group, rank 0's link (None on
    a rank > 0 under ``torchrun``) and ``serve`` for a rank > 0 to run until told to stop.
    Ranks 1..L-1 are spawned processes unless ``launcher`` starts them."""
    from rlloop.learners.process_group import torchrun_rank

    backend = backend_for(device)
    launched = torchrun_rank()
    if launched is not None:
        if launched.world_size != world_size:
            raise ConfigError(f"num_learners={world_size} but the launcher started "
                              f"{launched.world_size} processes (WORLD_SIZE); make them equal")
        group = init_group(launched.rank, launched.world_size, backend, None, spec.timeout_s)
        comm = rank_device(spec.device, group.rank) if backend == "nccl" else torch.device("cpu")
        link = ProcessLink([], comm, world_size) if group.rank == 0 else None
        return group, link, lambda learner: serve_commands(learner)
    host = LOOPBACK if launcher is None else launcher.host
    sock = listen_loopback(host)
    port = int(sock.getsockname()[1])
    fd = sock.detach()  # the store owns the descriptor from here and closes it
    try:
        store = make_store(0, world_size, port, fd, spec.timeout_s, host)
    except BaseException:
        os.close(fd)
        raise
    members: list[Any] = []
    try:
        if launcher is not None:
            members = launcher.start(spec, world_size, port)
        else:
            ctx = multiprocessing.get_context("spawn")
            for rank in range(1, world_size):
                proc = ctx.Process(target=serve, args=(rank, world_size, port, spec),
                                   name=f"rlloop-learner-{rank}", daemon=True)
                proc.start()
                members.append(proc)
        link = ProcessLink(members, rank_device(spec.device, 0) if backend == "nccl"
                           else torch.device("cpu"), world_size)
        _wait_ready(store, link, world_size)
        group = init_group(0, world_size, backend, store, spec.timeout_s, host == LOOPBACK)
    except BaseException:
        for proc in members:
            proc.kill()
            proc.join(timeout=10)
        destroy_group()
        raise
    return group, link, serve_commands


def _wait_ready(store: dist.Store, link: ProcessLink, world_size: int) -> None:
    keys = [f"ready/{r}" for r in range(1, world_size)]
    deadline = time.monotonic() + START_TIMEOUT_S
    while not store.check(keys):
        link._raise_if_dead()
        if time.monotonic() > deadline:
            raise LearnerGroupError(f"the learner ranks did not start within "
                                    f"{START_TIMEOUT_S:.0f} s")
        time.sleep(0.02)


def serve(rank: int, world_size: int, port: int, spec: LearnerSpec) -> None:
    """A spawned rank: join the group, build the learner, run rank 0's commands."""
    exit_with_parent()
    serve_rank(rank, world_size, port, spec)
    # Tearing the interpreter and torch down takes seconds on a loaded machine, and rank 0
    # waits for this process to end: nothing is left to flush.
    os._exit(0)


def serve_rank(rank: int, world_size: int, port: int, spec: LearnerSpec,
               host: str = LOOPBACK) -> None:
    """Rank ``rank`` in this process until rank 0 says ``close``: join the group through
    rank 0's rendezvous at ``host:port``, build the learner, run rank 0's commands."""
    torch.set_num_threads(spec.torch_threads)
    device = rank_device(spec.device, rank)
    backend = backend_for(device)
    store = make_store(rank, world_size, port, timeout_s=spec.timeout_s, host=host)
    store.set(f"ready/{rank}", "1")
    group = init_group(rank, world_size, backend, store, spec.timeout_s, host == LOOPBACK)
    try:
        serve_commands(spec.build(spec, group, device, None))
    finally:
        destroy_group()


def default_store() -> dist.Store:
    return dist.distributed_c10d._get_default_store()


def command_key(rank: int, seq: int) -> str:
    return f"rlloop/command/{rank}/{seq}"


def serve_commands(learner: DataParallel) -> None:
    """Run rank 0's commands until it says ``close``."""
    store, rank = default_store(), learner.group.rank
    for seq in itertools.count(1):
        key = command_key(rank, seq)
        store.wait([key], COMMAND_WAIT)
        store.delete_key(key)
        message = broadcast_message(None, learner.comm_device)
        op = message.pop("op")
        if op == "close":
            return
        learner.handle(op, message)
