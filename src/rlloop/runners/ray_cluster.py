"""The connection to a Ray cluster, local or remote (its settings: `rlloop.config.ray`).

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
from typing import Any

from rlloop.config.ray import RayConfig
from rlloop.errors import ConfigError

#: Ray reads this (``ray_constants.ENABLE_RAY_CLUSTER``) to decide whether a node's IP
#: is the routable one (a cluster) or the loopback address (one machine).
_SINGLE_MACHINE_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


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


def disconnect(started: bool) -> None:
    """Stop Ray if :func:`connect` started it."""
    if started:
        import ray

        ray.shutdown()
