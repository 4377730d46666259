"""Connecting to Ray: a local cluster started here, or an existing one, with its security and memory set on purpose.

Two Ray defaults are changed or pinned, deliberately:

- **Authentication: token where the cluster has one.** Ray 2.60 turns token authentication on for a local
  cluster started by ``ray.init()`` (it makes ``~/.ray/auth_token`` on first use), and ``ray start`` turns it on
  where ``RAY_AUTH_MODE`` is unset *and a token exists* (``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH`` or
  ``~/.ray/auth_token``). A driver given an explicit address does not apply that rule itself, so it fails against
  a token cluster (measured: ``ConnectionError``) unless ``RAY_AUTH_MODE=token`` is set. We apply ``ray start``'s
  rule on the driver: where the mode is unset, a driver joining a cluster turns tokens on if a token is there,
  and connects without them otherwise, as ``ray start`` did on the same machine (both measured on a machine with
  and without ``~/.ray/auth_token``). Every node of a cluster needs the same token. A mode set in the
  environment (``token`` or ``disabled``) is always kept. Ray's ports listen on the machine's network address,
  not only on loopback, so keep a token on a shared network. Measured cost of tokens: an actor round-trip of
  0.74 ms against 0.67 ms without.
- **Object store: 256 MiB for a local cluster** (Ray's default is 30 % of RAM, 7 GB here). The env pool's
  messages are small (a step's observation and info, a few KB), and Ray passes objects under 100 KB inline
  with the call, never through the store; a large store only reserves shared memory. On an existing cluster the
  store is what ``ray start --object-store-memory`` set.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path
from typing import Any

from agent_gym.error import AgentGymError

__all__ = ["LOCAL_OBJECT_STORE_BYTES", "RayClusterError", "connect_ray"]

LOCAL_OBJECT_STORE_BYTES = 256 * 1024 * 1024
AUTH_MODE_ENV = "RAY_AUTH_MODE"


class RayClusterError(AgentGymError, RuntimeError):
    """Ray is not installed, or its cluster cannot be started or reached; the message says what to do."""


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as error:
        raise RayClusterError(
            "env workers need Ray: pip install 'agent-gym[distributed]' (ray==2.60.0), or run without --env-workers"
        ) from error
    return ray


def _ray_token_available() -> bool:
    """Whether Ray would find an auth token here: the sources ``ray start`` looks at, in its order."""
    if os.environ.get("RAY_AUTH_TOKEN", "").strip():
        return True
    token_path = os.environ.get("RAY_AUTH_TOKEN_PATH")
    return Path(token_path).expanduser().is_file() if token_path else (Path.home() / ".ray" / "auth_token").is_file()


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail fast on a ``HOST:PORT`` nobody listens on: ``ray.init`` would retry it for minutes (measured: over
    300 s for a closed port on loopback)."""
    host, _, port = address.rpartition(":")
    if "://" in address or not host or not port.isdigit():
        return  # "auto", a ray:// client address or a bare host: Ray resolves those itself
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            pass
    except OSError as error:
        raise RayClusterError(
            f"cannot connect to the Ray cluster at {address}: nothing answers there ({error}); check the address "
            "(`ray status` on the head node prints it) and that the head's port is open to this machine"
        ) from error


def connect_ray(address: str | None = None, *, num_cpus: int | None = None,
                object_store_bytes: int = LOCAL_OBJECT_STORE_BYTES) -> Any:
    """Connect this process to Ray and return the ``ray`` module (a no-op when it is connected already).

    Args:
        address: an existing cluster (``HOST:PORT`` of its head, or ``auto``); None starts a local cluster in
            this process, which stops when the process exits.
        num_cpus: logical CPUs of a local cluster (default: this machine's). Each env worker reserves
            ``RayEnvPool``'s ``num_cpus`` of them.
        object_store_bytes: the local cluster's object store (see the module docstring).
    """
    # Ray reads the mode into its config when it is imported: set it first. A process that imported Ray already
    # (started a cluster in process, as Ray's test Cluster does) keeps the mode it has.
    if address and AUTH_MODE_ENV not in os.environ and "ray" not in sys.modules and _ray_token_available():
        os.environ[AUTH_MODE_ENV] = "token"
    ray = _import_ray()
    if ray.is_initialized():
        return ray
    if address:
        _check_reachable(address)
    try:
        if address:
            ray.init(address=address, configure_logging=True, logging_level="warning")
        else:
            ray.init(num_cpus=num_cpus or os.cpu_count() or 1, object_store_memory=object_store_bytes,
                     include_dashboard=False, configure_logging=True, logging_level="warning")
    except Exception as error:  # noqa: BLE001 - ConnectionError, AuthenticationError, RuntimeError...
        where = f"the Ray cluster at {address}" if address else "a local Ray cluster"
        raise RayClusterError(
            f"cannot connect to {where} ({error}); check the address (`ray status` on the head node), and that "
            f"{AUTH_MODE_ENV}={os.environ.get(AUTH_MODE_ENV)} and the auth token (~/.ray/auth_token or "
            "RAY_AUTH_TOKEN) match the cluster's"
        ) from error
    return ray
