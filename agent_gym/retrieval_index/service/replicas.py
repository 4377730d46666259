"""``agent-gym index serve --replicas N``: N search servers of one index on consecutive ports, kept alive.

Each replica is a whole ``agent-gym index serve`` process (with its own ``--workers``) on ``port + i``; the
supervisor starts them, restarts one that exits (after ``restart_delay`` seconds), and stops them all on Ctrl-C
or SIGTERM, or when a replica reports that the index cannot be loaded (exit status ``STARTUP_FAILURE``) or
exits with a usage error (status ``USAGE_ERROR``: its port is taken, say): every restart would fail the same way.
A replica never outlives its supervisor, even one killed with SIGKILL: on Linux
the kernel sends it SIGTERM when the supervisor dies (``PR_SET_PDEATHSIG``), and every replica also watches its
parent (``server.SUPERVISOR_PID_ENV``). The client spreads the load and fails over:
``RemoteRetriever("http://HOST:PORT,http://HOST:PORT+1,...")`` (the URL list the supervisor prints). Replicas
on several machines need no supervisor here: run ``agent-gym index serve`` on each and list their URLs.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from agent_gym.error import InvalidValue
from agent_gym.retrieval_index.base import RetrievalError
from agent_gym.retrieval_index.service.server import STARTUP_FAILURE, SUPERVISOR_PID_ENV, IndexLoadError

logger = logging.getLogger(__name__)

__all__ = ["USAGE_ERROR", "ReplicaFailedError", "ReplicaSupervisor", "replica_urls"]

USAGE_ERROR = 2  # `agent-gym index serve`'s exit status for an error it printed (a taken port, a missing index)


class ReplicaFailedError(RetrievalError):
    """A replica exited with an error that restarting it would only repeat (it printed the error)."""


def replica_urls(host: str, port: int, replicas: int) -> list[str]:
    """The URLs of ``replicas`` servers on ``host`` from ``port`` on."""
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    return [f"http://{shown}:{port + index}" for index in range(replicas)]


@dataclass
class _Child:
    port: int
    process: subprocess.Popen | None = None
    restarts: int = 0
    down_since: float | None = None  # when its exit was noticed


class ReplicaSupervisor:
    """Runs one server process per port, restarting any that exits.

    Args:
        command_for_port: the argv of the server for a port.
        ports: one replica per port.
        restart_delay: seconds between noticing an exit and starting the replica again.
    """

    def __init__(self, command_for_port: Callable[[int], Sequence[str]], ports: Sequence[int],
                 restart_delay: float = 1.0) -> None:
        if not ports:
            raise InvalidValue("ReplicaSupervisor needs at least one port")
        self.command_for_port = command_for_port
        self.children = [_Child(port) for port in ports]
        self.restart_delay = restart_delay

    def start(self) -> None:
        for child in self.children:
            self._spawn(child)

    def _spawn(self, child: _Child) -> None:
        env = {**os.environ, SUPERVISOR_PID_ENV: str(os.getpid())}
        child.process = subprocess.Popen(list(self.command_for_port(child.port)), env=env,
                                         preexec_fn=_die_with_parent(os.getpid()))
        child.down_since = None

    def poll(self) -> list[int]:
        """Restart the replicas that exited more than ``restart_delay`` ago; return their ports."""
        restarted = []
        now = time.monotonic()
        for child in self.children:
            if child.process is None or child.process.poll() is None:
                continue
            if child.process.returncode == STARTUP_FAILURE:
                raise IndexLoadError(f"the replica on port {child.port} cannot load the index (its error is above)")
            if child.process.returncode == USAGE_ERROR:
                # Its port was taken (by another program, after the supervisor's check), say: restarting it
                # every second would fail the same way forever.
                raise ReplicaFailedError(f"the replica on port {child.port} exited with a usage error "
                                         "(its error is above)")
            if child.down_since is None:
                child.down_since = now
                logger.warning("search replica on port %d exited with status %s; restarting it in %g s",
                               child.port, child.process.returncode, self.restart_delay)
            if now - child.down_since >= self.restart_delay:
                child.restarts += 1
                self._spawn(child)
                restarted.append(child.port)
        return restarted

    def stop(self, timeout: float = 10.0) -> None:
        """Terminate every replica (SIGTERM, then SIGKILL after ``timeout``)."""
        for child in self.children:
            if child.process is not None and child.process.poll() is None:
                child.process.terminate()
        deadline = time.monotonic() + timeout
        for child in self.children:
            if child.process is None:
                continue
            try:
                child.process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.process.kill()
                child.process.wait()

    def run(self, poll_interval: float = 0.5) -> None:
        """Start the replicas and keep them alive until Ctrl-C or SIGTERM; raise :class:`IndexLoadError` (after
        stopping them all) when one cannot load the index, :class:`ReplicaFailedError` when one exits with a
        usage error."""

        def _terminate(signum: int, frame: object) -> None:
            raise KeyboardInterrupt

        previous = signal.signal(signal.SIGTERM, _terminate)
        self.start()
        try:
            while True:
                time.sleep(poll_interval)
                self.poll()
        except KeyboardInterrupt:
            pass
        finally:
            self.stop()
            signal.signal(signal.SIGTERM, previous)


_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _die_with_parent(parent: int) -> Callable[[], None] | None:
    """A ``preexec_fn`` that has the kernel SIGTERM the child when ``parent`` dies (Linux; None elsewhere)."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here: the forked child only calls it

    def tie() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # the supervisor died before the tie took hold
            os._exit(1)

    return tie


def serve_command(index: str, host: str, port: int, options: Sequence[str]) -> list[str]:
    """The argv of one replica: ``agent-gym index serve`` in this interpreter."""
    return [sys.executable, "-m", "agent_gym.cli", "index", "serve", index, "--host", host, "--port", str(port),
            *options]
