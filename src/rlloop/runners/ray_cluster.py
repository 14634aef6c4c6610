"""Ray settings and the connection to a Ray cluster, local or remote.

Nothing here imports Ray at module level: a run without env runners never loads it.

A local instance (no ``ray.address``) is started bound to the loopback interface: Ray's
servers bind to the node IP, and on Linux Ray picks the address that routes to the
internet unless told that this is a single-machine instance
(``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, which makes the node IP 127.0.0.1). The
dashboard (an HTTP server) is started only with ``ray.dashboard=true``, on 127.0.0.1 too.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from rlloop.errors import ConfigError

#: The algorithms whose sampling env runners can take over.
RUNNER_ALGOS = ("ppo", "dqn", "sac", "td3")
#: Ray reads this (``ray_constants.ENABLE_RAY_CLUSTER``) to decide whether a node's IP
#: is the routable one (a cluster) or the loopback address (one machine).
_SINGLE_MACHINE_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


@dataclass
class RayConfig:
    """Where env runners run (section ``ray``, used only with ``num_env_runners > 0``)."""

    address: str | None = None
    """An existing cluster ("auto", "host:6379", "ray://host:10001"); None starts a local
    instance bound to 127.0.0.1 that ends with the run."""
    dashboard: bool = False
    """Start Ray's dashboard (a local instance only; it listens on 127.0.0.1:8265)."""
    num_cpus_per_runner: float = 1.0
    """CPUs each runner actor reserves on the cluster (Ray spreads the actors over nodes)."""
    num_cpus: int | None = None
    """CPUs a local instance offers (None: this machine's count, or enough for every runner
    and learner actor when that is more: a runner that waits on a slow env needs no core of
    its own)."""
    learner_actors: bool = True
    """With ``num_learners > 1``, run learner ranks 1..L-1 as Ray actors on this instance
    (false: processes spawned on this machine, as without env runners)."""
    num_cpus_per_learner: float = 1.0
    """CPUs each learner actor reserves."""
    num_gpus_per_learner: float | None = None
    """GPUs each learner actor reserves (None: 1 when ``device`` is CUDA, else 0)."""

    def __post_init__(self) -> None:
        if self.address is not None and not self.address.strip():
            raise ConfigError("ray.address is empty; pass a cluster address such as auto or "
                              "host:6379, or null for a local instance")
        if self.num_cpus is not None and self.num_cpus <= 0:
            raise ConfigError(f"ray.num_cpus must be > 0 (or null), got {self.num_cpus}")
        for name in ("num_cpus_per_runner", "num_cpus_per_learner", "num_gpus_per_learner"):
            value = getattr(self, name)
            if value is not None and not value >= 0:
                raise ConfigError(f"ray.{name} must be >= 0, got {value}")


@contextmanager
def _single_machine() -> Iterator[None]:
    """Ray started inside this block takes 127.0.0.1 as its node IP: the processes it
    starts read the variable, and this one reads the constant Ray derived from it when
    it was imported (Ray 2.x: ``ray._private.ray_constants.ENABLE_RAY_CLUSTER``)."""
    from ray._private import ray_constants

    old = os.environ.get(_SINGLE_MACHINE_ENV)
    old_constant = getattr(ray_constants, "ENABLE_RAY_CLUSTER", True)
    os.environ[_SINGLE_MACHINE_ENV] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = old_constant
        if old is None:
            os.environ.pop(_SINGLE_MACHINE_ENV, None)
        else:
            os.environ[_SINGLE_MACHINE_ENV] = old


#: An HTTP/2 client's first bytes (the connection preface, then an empty SETTINGS frame).
#: Every gRPC server, as Ray's GCS and its client server are, answers them with a
#: SETTINGS frame of its own (frame type 4, the 4th byte of the 9-byte frame header).
_HTTP2_HELLO = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
_HTTP2_SETTINGS = 4


def check_reachable(address: str, timeout_s: float = 3.0) -> None:
    """``ConfigError`` unless a Ray cluster answers at a ``host:port`` (or
    ``ray://host:port``) address within ``timeout_s``: nothing listens there, or what
    accepts the connection (a firewall, a proxy, another server) does not reply as a gRPC
    server does. Ray itself retries such an address for minutes, printing a warning every
    few seconds, before it fails. ``auto`` and addresses without a port are left to Ray;
    with Ray's TLS (``RAY_USE_TLS``) only the connection is checked."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit() or not host:
        return
    fix = ("start one there (ray start --head), fix ray.address / --ray-address, or leave "
           "it out for a local instance")
    deadline = time.monotonic() + timeout_s
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s) as conn:
            if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
                return  # the server expects a TLS handshake, not HTTP/2 in the clear
            conn.settimeout(max(deadline - time.monotonic(), 0.1))
            conn.sendall(_HTTP2_HELLO)
            header = _receive(conn, 9)
    except TimeoutError:
        raise ConfigError(f"no Ray cluster answers at {address} (nothing replied within "
                          f"{timeout_s:g} s); {fix}") from None
    except OSError as e:
        raise ConfigError(f"no Ray cluster answers at {address} ({e.strerror or e}); "
                          f"{fix}") from None
    if len(header) < 9 or header[3] != _HTTP2_SETTINGS:
        raise ConfigError(f"no Ray cluster answers at {address} (the server there does not "
                          f"speak Ray's gRPC); {fix}")


def _receive(conn: socket.socket, size: int) -> bytes:
    """Up to ``size`` bytes from ``conn``: fewer when the peer closes the connection."""
    data = b""
    while len(data) < size and (chunk := conn.recv(size - len(data))):
        data += chunk
    return data


def connect(config: RayConfig, num_runners: int, num_learner_actors: int = 0) -> bool:
    """Make sure this process is connected to Ray; returns whether it started Ray itself
    (then :func:`disconnect` stops it). A process already connected (a test's instance, a
    user's script) is used as it is."""
    import ray

    if ray.is_initialized():
        return False
    common: dict[str, Any] = {"log_to_driver": False, "configure_logging": True,
                              "logging_level": logging.WARNING}
    if config.address is not None:
        check_reachable(config.address)
        with _own_sigterm():
            ray.init(address=config.address, **common)
        return True
    # Enough CPUs for every runner to be placed, even beyond the cores: the user asked
    # for that many (a sleep-bound env scales past the core count).
    cpus = config.num_cpus or max(os.cpu_count() or 1, math.ceil(
        num_runners * config.num_cpus_per_runner
        + num_learner_actors * config.num_cpus_per_learner))
    with _single_machine(), _own_sigterm():
        ray.init(num_cpus=cpus, include_dashboard=config.dashboard,
                 dashboard_host="127.0.0.1", **common)
    return True


@contextmanager
def _own_sigterm() -> Iterator[None]:
    """SIGTERM handled in Python after ``ray.init``: Ray's driver sets a Python handler
    (``sys.exit(15)``: the exit hooks then shut Ray down) and, starting its core worker, a
    C crash handler under it that dumps a stack and aborts (exit code 134, at times a
    segfault, for a SIGTERM while learner actors or runners started). The Python handler
    is put back in charge; rlloop's stop handler replaces it while training."""
    try:
        yield
    finally:
        if threading.current_thread() is threading.main_thread():
            handler = signal.getsignal(signal.SIGTERM)  # (None: set in C; not to be had)
            signal.signal(signal.SIGTERM, signal.SIG_DFL if handler is None else handler)


def learner_actors(config: Any) -> int:
    """How many learner ranks of a run (a ``RunConfig``) are Ray actors: ranks 1..L-1 when
    Ray is in use (env runners) and ``ray.learner_actors`` is on, else none."""
    if config.num_env_runners > 0 and config.ray.learner_actors:
        return int(config.num_learners) - 1
    return 0


def disconnect(started: bool) -> None:
    """Stop Ray if :func:`connect` started it."""
    if started:
        import ray

        ray.shutdown()


def check_env_runners(config: Any) -> None:
    """ConfigError for env-runner settings (of a ``RunConfig``) that cannot work."""
    for name in ("num_env_runners", "max_weight_lag", "max_restarts"):
        if getattr(config, name) < 0:
            raise ConfigError(f"{name} must be >= 0, got {getattr(config, name)}")
    for name in ("num_envs_per_runner", "fragment_steps"):
        value = getattr(config, name)
        if value is not None and value <= 0:
            raise ConfigError(f"{name} must be > 0 (or null), got {value}")
    if not config.num_env_runners:
        return
    section = config.algo
    if getattr(config.hparams, "normalize_obs", False):
        raise ConfigError(f"{section}.normalize_obs is not supported with env runners (each "
                          f"would keep its own statistics); set {section}.normalize_obs=false "
                          "or num_env_runners=0")
    if config.fragment_steps is not None and hasattr(config.hparams, "rollout_steps"):
        raise ConfigError(f"fragment_steps applies to off-policy runners; {section}'s "
                          f"fragments are {section}.rollout_steps long, set that instead")
    if section not in RUNNER_ALGOS:
        raise ConfigError(f"{section} does not support env runners (only "
                          f"{', '.join(RUNNER_ALGOS)} do); use num_env_runners=0")
    if getattr(config.hparams, "recurrent", None):
        raise ConfigError(f"{section}.recurrent is not supported with env runners (the "
                          "memory state and episode starts stay in the runners); use "
                          "num_env_runners=0")
    if getattr(config.hparams, "replay", None) == "frames" and config.num_env_runners > 1:
        raise ConfigError(f"{section}.replay=frames takes one env stream per row, which "
                          "several runners do not give; use num_env_runners=1 or "
                          f"{section}.replay=uniform")
