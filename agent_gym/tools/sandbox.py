"""Run untrusted Python in a separate, limited process (docs/DESIGN.md §1: code that runs model output).

Each :meth:`Sandbox.run` starts a fresh interpreter in a fresh temporary directory (removed afterwards), with
no inherited environment variable, stdin closed, and stdout/stderr captured and clipped. The process gets:

- limits: wall-clock seconds (the parent kills it), CPU seconds, address space, file size and a total for its
  directory (a ``tmpfs`` of ``disk_mb`` where user namespaces work; else the parent polls it);
- no network: a new user and network namespace through ``unshare`` where Linux allows unprivileged ones; where
  it does not, the launcher's seccomp filter still refuses every socket and Landlock (ABI >= 4) every TCP
  connect, so the fallback is documented, not silent: :attr:`SandboxRun.isolation` says which layers held;
- one process only, and no reach into any other: seccomp refuses ``fork``/``vfork``/``clone`` of a process,
  so a fork bomb stops at its first fork (threads still work); signals, ``prlimit``, priorities, affinity and
  scheduling work on itself only; no ``ptrace``;
- reads only of the interpreter, its libraries and its own directory; writes only there (Landlock); outside it
  a read-only view, metadata included (a mount namespace; without one, seccomp refuses every metadata change);
- no life beyond its parent's: the kernel kills it when the process that started it dies, and its own timer
  kills it a second after its wall limit; a run directory whose process died with it (``kill -9`` of the env)
  is removed by the next process that starts a run (each run holds a lock on its directory while it lives).

The verdict of a run is the parent's: the isolation it reports comes from the launcher's first record only,
and a program's own records (``assert_passed``) count only for asserts the parent finds in its source, once
each, and only where the values they carry satisfy the assert as the parent evaluates it: its comparison
operators and literals are the parent's own reading of the source, and the values are built-in ones. A record
alone (``{"kind": "assert_passed", "line": 3}`` written to the pipe) counts for nothing. No record of the
program's process can prove more than that: the program defines what its asserts call, so it can always make
them hold; counted asserts are a shaping signal, not a verdict.

:mod:`agent_gym.tools.sandbox_child` applies the in-process layers; its docstring lists them. Where a layer is
missing (an old kernel, an architecture without a seccomp table), a warning says so once and the run goes on;
``Sandbox(strict=True)`` refuses to run instead.
"""

from __future__ import annotations

import fcntl
import functools
import json
import math
import operator
import os
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym

from agent_gym.error import AgentGymError, InvalidType, InvalidValue
from agent_gym.tools import disk_watch, sandbox_child
from agent_gym.tools.disk_watch import DiskWatch

__all__ = ["Sandbox", "SandboxLimits", "SandboxRun", "SandboxError", "SandboxUnavailable", "namespace_command"]

MAIN_FILE = "main.py"
RUN_DIR_PREFIX = "agent-gym-run-"
# A run directory is made under this name, locked, then renamed to RUN_DIR_PREFIX...: a sweep never sees a live
# run's directory unlocked. One left under it (its process died in that instant) is swept once it is stale.
_NEW_RUN_DIR_PREFIX = "." + RUN_DIR_PREFIX
_STALE_AFTER_S = 10.0  # a run directory this old whose lock is free lost its process
REPORT_FD = sandbox_child.REPORT_FD
_REPORT_LIMIT_BYTES = 1 << 20
_EXIT_GRACE_S = 0.2  # after the program exits, how long its pipes may take to reach end-of-file
# Variables the program sees, fixed here and never inherited: a run must not depend on (or read) the caller's.
_FIXED_ENVIRONMENT = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1",
                      "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


class SandboxError(AgentGymError, RuntimeError):
    """The sandbox itself failed to start or to clean up (not the program it ran)."""


class SandboxUnavailable(AgentGymError, RuntimeError):
    """``strict=True`` and this machine cannot give every isolation layer; the message names the missing one."""


@dataclass(frozen=True)
class SandboxLimits:
    """What one run may use. Defaults suit a test-driven coding turn (HumanEval-size programs).

    Attributes:
        wall_s: wall-clock seconds before the parent kills the process.
        cpu_s: CPU seconds (whole seconds, rounded up) before the kernel stops it.
        memory_mb: address space in MiB; an allocation beyond it raises ``MemoryError``.
        file_mb: the largest file the program may write, in MiB.
        disk_mb: all the files of its directory together, in MiB (a ``tmpfs``, so memory too; where user
            namespaces are off, the parent polls the directory and stops the run past it).
        output_chars: characters of stdout and of stderr kept each; the rest is cut with a note.
        code_chars: the longest program accepted.
    """

    wall_s: float = 10.0
    cpu_s: float = 5.0
    memory_mb: int = 1024
    file_mb: int = 16
    disk_mb: int = 64
    output_chars: int = 4_000
    code_chars: int = 50_000

    def __post_init__(self) -> None:
        for name in ("wall_s", "cpu_s", "memory_mb", "file_mb", "disk_mb", "output_chars", "code_chars"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
                raise InvalidValue(f"SandboxLimits.{name} must be a positive number, got {value!r}")


@dataclass
class SandboxRun:
    """What happened in one run.

    Attributes:
        status: ``ok`` (exit code 0), ``exit`` (another exit code), ``exception`` (uncaught), ``memory`` (a
            ``MemoryError`` at the address-space limit), ``timeout`` (wall clock), ``cpu_limit``, ``disk`` (stopped
            past ``disk_mb`` where no namespace gives a size-limited directory), ``signal``
            (killed or crashed by a signal) or ``refused`` (strict mode, isolation incomplete).
        exit_code: the process's exit code (negative: the signal that ended it).
        stdout, stderr: the output, each clipped to ``output_chars`` with a note of what was cut.
        stdout_bytes, stderr_bytes: how much the program wrote in all.
        exception: the type name of an uncaught exception, if any.
        signal_name: e.g. ``SIGSEGV`` when a signal ended the process.
        wall_s, cpu_s: time taken.
        isolation: the layers that held (``namespaces``, ``private_view``, ``landlock`` ABI, ``lifetime``: the
            run dies with its parent and at its own wall limit, ``seccomp``), as the launcher reported them before
            the program ran.
        reports: the JSON records the program wrote to the report pipe (a harness's results); with
            ``count_asserts``, ``assert_passed`` records only for asserts the source holds, each once, whose
            values satisfy them.
    """

    status: str
    exit_code: int
    stdout: str
    stderr: str
    stdout_bytes: int
    stderr_bytes: int
    wall_s: float
    cpu_s: float
    limits: SandboxLimits
    exception: str | None = None
    signal_name: str | None = None
    isolation: dict[str, Any] = field(default_factory=dict)
    reports: list[dict[str, Any]] = field(default_factory=list)

    def summary(self) -> str:
        """One line for the agent: how the run ended."""
        limits = self.limits
        if self.status == "ok":
            return "finished (exit code 0)"
        if self.status == "exit":
            return f"exited with code {self.exit_code}"
        if self.status == "exception":
            return f"raised {self.exception} (traceback in stderr)"
        if self.status == "memory":
            return f"ran out of memory: MemoryError at the {limits.memory_mb} MiB limit"
        if self.status == "timeout":
            return f"timed out: stopped after {limits.wall_s:g} s of wall-clock time"
        if self.status == "cpu_limit":
            return f"timed out: stopped after {math.ceil(limits.cpu_s)} s of CPU time"
        if self.status == "refused":
            return "not run: the sandbox could not isolate it (strict mode)"
        if self.status == "disk":
            return f"ran out of disk: stopped past {limits.disk_mb} MiB for all its files"
        if self.signal_name in ("SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE", "SIGABRT"):
            return f"crashed: killed by {self.signal_name} ({signal.strsignal(-self.exit_code)})"
        return f"killed by {self.signal_name or 'a signal'}"

    def observation(self) -> str:
        """What the agent reads: how the run ended, then its stdout and stderr (each only when non-empty)."""
        parts = [f"[status] {self.summary()}"]
        if self.stdout:
            parts.append(f"[stdout]\n{self.stdout.rstrip()}")
        if self.stderr:
            parts.append(f"[stderr]\n{self.stderr.rstrip()}")
        return "\n".join(parts)


@functools.cache
def namespace_command() -> tuple[str, ...]:
    """The ``unshare`` prefix that gives a run new user and network namespaces here, or ``()`` if none works.

    Probed once per process: unprivileged user namespaces may be off (a sysctl, AppArmor's restriction on
    Ubuntu >= 23.10, a container's seccomp profile), and util-linux before 2.38 lacks ``--map-current-user``.
    """
    unshare = shutil.which("unshare", path="/usr/bin:/bin:/usr/sbin:/sbin")
    if unshare is None or not sys.platform.startswith("linux"):
        return ()
    for user_mapping in ("--map-current-user", "--map-root-user"):
        command = (unshare, "--user", user_mapping, "--net")
        try:
            probe = subprocess.run([*command, "/bin/true"], env={}, stdin=subprocess.DEVNULL,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=10, check=False)
        except (OSError, subprocess.SubprocessError):
            continue
        if probe.returncode == 0:
            return command
    return ()


_warned: set[str] = set()


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        gym.logger.warn(message)


class Sandbox:
    """Runs Python programs in separate, limited processes; one object serves many concurrent runs.

    Args:
        limits: the :class:`SandboxLimits` of each run.
        site_packages: let programs import installed packages (numpy, sympy...); the standard library only
            otherwise, which starts faster.
        strict: refuse to run (``SandboxUnavailable``) where an isolation layer is missing, instead of warning.
        python: the interpreter to run (this one by default).
    """

    def __init__(self, limits: SandboxLimits | None = None, *, site_packages: bool = False, strict: bool = False,
                 python: str | None = None) -> None:
        self.limits = limits or SandboxLimits()
        self.site_packages = site_packages
        self.strict = strict
        self.python = python or sys.executable
        if not sys.platform.startswith("linux"):
            raise SandboxUnavailable(f"the Python sandbox needs Linux (resource limits, Landlock, seccomp); this is "
                                     f"{sys.platform}: run the environment on Linux or in a Linux container")

    def __repr__(self) -> str:
        return f"Sandbox({self.limits!r}, site_packages={self.site_packages}, strict={self.strict})"

    def run(self, code: str, *, files: Mapping[str, str] | None = None, count_asserts: bool = False,
            channels: Mapping[int, int] | None = None) -> SandboxRun:
        """Run ``code`` as ``main.py`` in a fresh directory that also holds ``files`` (name -> text).

        ``count_asserts`` reports each module-level ``assert`` that calls something and passes, as an
        ``assert_passed`` record. ``channels`` maps a descriptor number the program finds open (4 and up) to a
        descriptor of this process (a pipe's end) that it gets there; each is closed here once the program
        started, so that its peer sees end-of-file when the program ends. Never raises for anything the program
        does; raises :class:`SandboxError` only when the sandbox cannot start, and :class:`SandboxUnavailable`
        in strict mode.
        """
        channels = dict(channels or {})
        try:
            if not isinstance(code, str):
                raise InvalidType(f"code must be a str, got {type(code).__name__}")
            if any(number <= REPORT_FD for number in channels):
                raise InvalidValue(f"channels must use descriptor numbers above {REPORT_FD}, got {sorted(channels)}")
            namespaces = self._namespaces()
            _sweep_once()
            directory = tempfile.mkdtemp(prefix=_NEW_RUN_DIR_PREFIX)
        except BaseException:
            _close_all(channels.values())
            raise
        lock = None
        try:
            lock = _lock_directory(directory)  # held while the run lives: the sweep of other processes skips it
            named = os.path.join(os.path.dirname(directory), os.path.basename(directory)[1:])
            os.rename(directory, named)  # the lock follows the directory: it is never visible unlocked
            directory = named
            for name, text in {**(files or {}), MAIN_FILE: code}.items():
                path = Path(directory, name)
                if path.parent != Path(directory):
                    raise InvalidValue(f"file names must be plain names inside the run directory, got {name!r}")
                path.write_text(text, encoding="utf-8", errors="replace")
            run = self._run_in(directory, namespaces, count_asserts, channels)
        finally:
            _close_all(channels.values())
            try:
                _remove_tree(directory)
            finally:
                if lock is not None:
                    os.close(lock)
        if count_asserts:
            run.reports = _counted_asserts(run.reports, sandbox_child.assert_plans(code))
        return run

    def _namespaces(self) -> tuple[str, ...]:
        namespaces = namespace_command()
        if not namespaces:
            if self.strict:
                raise SandboxUnavailable("no network namespace: unprivileged user namespaces are off here "
                                         "(sysctl kernel.unprivileged_userns_clone or AppArmor); enable them or "
                                         "use strict=False, which keeps seccomp's no-socket rule")
            _warn_once("namespaces", "Python sandbox: no user/network namespace here; the program is kept off the "
                                     "network by seccomp (no socket) and Landlock (no TCP) only, every metadata "
                                     "change is refused, and the disk total is polled, not capped by a tmpfs")
        return namespaces

    def _run_in(self, directory: str, namespaces: tuple[str, ...], count_asserts: bool,
                channels: dict[int, int]) -> SandboxRun:
        limits = self.limits
        config = {"main": MAIN_FILE, "cpu_s": math.ceil(limits.cpu_s), "memory_bytes": limits.memory_mb << 20,
                  "file_bytes": limits.file_mb << 20, "disk_bytes": limits.disk_mb << 20,
                  "count_asserts": count_asserts, "strict": self.strict, "private_view": bool(namespaces),
                  "site_packages": self.site_packages, "channels": {str(k): v for k, v in channels.items()},
                  "parent_pid": os.getpid(), "wall_s": limits.wall_s}
        flags = ["-I", "-u", "-X", "utf8"] + ([] if self.site_packages else ["-S"])
        report_read, report_write = os.pipe()
        config["report_fd"] = report_write
        argv = [*namespaces, self.python, *flags, sandbox_child.__file__, json.dumps(config)]
        started = time.perf_counter()
        try:
            process = subprocess.Popen(
                argv, cwd=directory, env={**_FIXED_ENVIRONMENT, "HOME": directory}, stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                pass_fds=(report_write, *channels.values()),
            )
        except OSError as error:
            os.close(report_read)
            raise SandboxError(f"could not start {self.python}: {error}") from error
        finally:
            _close_all([report_write, *channels.values()])
            channels.clear()
        try:
            streams = _Streams(process, report_read, limits)
            # without namespaces the directory is no size-limited tmpfs: the parent watches its total instead
            disk = None if namespaces else DiskWatch(directory, limits.disk_mb << 20)
            stopped = streams.collect(started + limits.wall_s, disk)
        except BaseException:  # Ctrl-C (KeyboardInterrupt) or an error here: the program must not outlive it
            _reap(process)
            raise
        exit_code, cpu_s = _reap(process)
        run = _describe(exit_code, cpu_s, time.perf_counter() - started, stopped, streams, limits, bool(namespaces),
                        self.strict)
        if run.status == "refused":
            raise SandboxUnavailable(f"strict sandbox: an isolation layer is missing here: {run.isolation}")
        return run


def _lock_directory(directory: str) -> int:
    """Hold an exclusive lock on the run's directory while the run lives; returns the descriptor to close."""
    descriptor = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    fcntl.flock(descriptor, fcntl.LOCK_EX)
    return descriptor


def sweep_stale_runs(parent: str | None = None, *, min_age_s: float = _STALE_AFTER_S) -> list[str]:
    """Remove this user's run directories in ``parent`` (the temporary folder) that no live run holds: those
    of an env process killed during a run (its program died with it). Returns the paths removed."""
    parent = parent or tempfile.gettempdir()
    removed = []
    try:
        names = [name for name in os.listdir(parent) if name.startswith((RUN_DIR_PREFIX, _NEW_RUN_DIR_PREFIX))]
    except OSError:
        return removed
    for name in names:
        path = os.path.join(parent, name)
        try:
            info = os.lstat(path)
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
                continue
            # a new directory is unlocked for an instant after mkdtemp: only a stale one is swept, whatever the age
            # asked for (a named one is locked before it gets its name)
            age = time.time() - info.st_mtime
            if age < min_age_s or (name.startswith(_NEW_RUN_DIR_PREFIX) and age < _STALE_AFTER_S):
                continue
            descriptor = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)  # OSError: a live run holds it
            _remove_tree(path)
            removed.append(path)
        except (OSError, SandboxError):
            continue
        finally:
            os.close(descriptor)
    return removed


@functools.cache
def _sweep_once() -> None:
    sweep_stale_runs()


def _close_all(descriptors) -> None:
    for descriptor in list(descriptors):
        try:
            os.close(descriptor)
        except OSError:
            pass


def _counted_asserts(reports: list[dict[str, Any]], plans: dict[int, tuple]) -> list[dict[str, Any]]:
    """The records with ``assert_passed`` kept only for asserts the source holds, each once, whose reported
    values satisfy the assert as this process evaluates it: a program can write such records itself, but cannot
    report more asserts than it holds, nor one whose values make it false."""
    kept, seen = [], set()
    for record in reports:
        if record.get("kind") == "assert_passed":
            line = record.get("line")
            if type(line) is not int or line not in plans or line in seen or not _holds(plans[line], record):
                continue
            seen.add(line)
        kept.append(record)
    return kept


_COMPARISONS = {"Eq": operator.eq, "NotEq": operator.ne, "Lt": operator.lt, "LtE": operator.le, "Gt": operator.gt,
                "GtE": operator.ge, "In": lambda a, b: a in b, "NotIn": lambda a, b: a not in b,
                "Is": operator.is_, "IsNot": operator.is_not}
_SINGLETONS = (None, True, False)


def _holds(plan: tuple, record: dict[str, Any]) -> bool:
    """Whether the assert of ``plan`` (:func:`sandbox_child.assert_plans`) holds for the record's values."""
    kind, ops, operands = plan
    reported = record.get("values")
    if type(reported) is not list:
        return False
    try:
        values = {index: _decode(data) for index, data in reported}
        resolved = [value if source == "literal" else values[value] for source, value in operands]
        if kind == "truth":
            return bool(resolved[0])
        if kind == "not":
            return not resolved[0]
        for name, left, right in zip(ops, resolved, resolved[1:], strict=False):
            # identity means nothing across processes but for None, True and False
            if name in ("Is", "IsNot") and not any(value is single for value in (left, right) for single in
                                                   _SINGLETONS):
                return False
            if not _COMPARISONS[name](left, right):
                return False
        return True
    except (KeyError, TypeError, ValueError, RecursionError, _NotEncoded):
        return False


class _NotEncoded(Exception):
    """A report's value that :func:`sandbox_child.encode_value` did not write."""


def _decode(data: Any, depth: int = 0) -> Any:
    """The built-in value :func:`sandbox_child.encode_value` wrote; raises ``_NotEncoded`` on anything else."""
    if data is None or type(data) in (bool, int, str):
        return data
    if type(data) is not dict or len(data) != 1 or depth > 50:
        raise _NotEncoded("not an encoded value")
    ((tag, payload),) = data.items()
    if tag == "float" and type(payload) is str:
        return float(payload)
    if tag == "complex" and type(payload) is list and len(payload) == 2:
        return complex(float(payload[0]), float(payload[1]))
    if tag == "bytes" and type(payload) is str:
        return bytes.fromhex(payload)
    if tag in _CONTAINERS and type(payload) is list:
        return _CONTAINERS[tag](_decode(item, depth + 1) for item in payload)
    if tag == "dict" and type(payload) is list:
        return {_decode(key, depth + 1): _decode(item, depth + 1) for key, item in payload}
    raise _NotEncoded("not an encoded value")


_CONTAINERS = {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}


class _Streams:
    """Reads stdout, stderr and the report pipe together, keeping a bounded head of each."""

    def __init__(self, process: subprocess.Popen, report_fd: int, limits: SandboxLimits) -> None:
        self.process = process
        self.keep_bytes = limits.output_chars * 4  # UTF-8: at most 4 bytes a character
        self.chunks: dict[str, bytearray] = {"stdout": bytearray(), "stderr": bytearray(), "report": bytearray()}
        self.totals = {"stdout": 0, "stderr": 0, "report": 0}
        self.selector = selectors.DefaultSelector()
        assert process.stdout is not None and process.stderr is not None
        for name, stream in (("stdout", process.stdout.fileno()), ("stderr", process.stderr.fileno()),
                             ("report", report_fd)):
            os.set_blocking(stream, False)
            self.selector.register(stream, selectors.EVENT_READ, name)
        self.report_fd = report_fd
        try:
            self.pidfd: int | None = os.pidfd_open(process.pid)
            self.selector.register(self.pidfd, selectors.EVENT_READ, "exit")
        except (AttributeError, OSError):  # Linux < 5.3: poll for the exit instead
            self.pidfd = None

    def collect(self, deadline: float, disk: DiskWatch | None = None) -> str | None:
        """Read until the process exits and its pipes close, until ``deadline`` (returns ``timeout``) or until
        ``disk`` finds the directory over its cap (returns ``disk``); None when the program ended by itself."""
        exited_at: float | None = None
        try:
            while True:
                pipes_open = any(key.data != "exit" for key in self.selector.get_map().values())
                if exited_at is None and self.pidfd is None and _has_exited(self.process.pid):
                    exited_at = time.perf_counter()
                now = time.perf_counter()
                if disk is not None and disk.over(force=exited_at is not None):
                    return "disk"
                if exited_at is not None and (not pipes_open or now - exited_at > _EXIT_GRACE_S):
                    return None
                if now >= deadline:
                    return "timeout"
                timeout = deadline - now
                if exited_at is not None:
                    timeout = min(timeout, exited_at + _EXIT_GRACE_S - now)
                elif self.pidfd is None:
                    timeout = min(timeout, 0.01)  # no pidfd to wake us at the exit: poll
                if disk is not None:
                    timeout = min(timeout, disk_watch.POLL_S)
                for key, _ in self.selector.select(timeout=max(timeout, 0.0)):
                    if key.data == "exit":
                        self.selector.unregister(key.fd)
                        exited_at = time.perf_counter()
                    else:
                        self._read(key.fd, key.data)
        finally:
            self.selector.close()
            for fd in (self.report_fd, self.pidfd):
                if fd is not None:
                    os.close(fd)

    def _read(self, fd: int, name: str) -> None:
        try:
            data = os.read(fd, 1 << 16)
        except BlockingIOError:
            return
        if not data:
            self.selector.unregister(fd)
            return
        self.totals[name] += len(data)
        limit = _REPORT_LIMIT_BYTES if name == "report" else self.keep_bytes
        room = limit - len(self.chunks[name])
        if room > 0:
            self.chunks[name] += data[:room]

    def text(self, name: str, limit_chars: int) -> str:
        text = self.chunks[name].decode("utf-8", errors="replace")
        shown = text[:limit_chars]
        cut = self.totals[name] - len(shown.encode("utf-8", errors="replace"))
        if cut > 0:
            shown += (f"\n[... output cut: {self.totals[name]:,} bytes in all, the first {limit_chars:,} characters "
                      "shown]")
        return shown

    def reports(self) -> list[dict[str, Any]]:
        records = []
        for line in self.chunks["report"].decode("utf-8", errors="replace").splitlines():
            try:
                record = json.loads(line)
            except (ValueError, RecursionError):  # garbage from the program: dropped, never an error here
                continue
            if isinstance(record, dict):
                records.append(record)
        return records


def _has_exited(pid: int) -> bool:
    """Whether the process has exited, without reaping it (its CPU time is read when it is reaped)."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _reap(process: subprocess.Popen) -> tuple[int, float]:
    """Kill what is left of the run's process group, reap the process, and return (exit code, CPU seconds)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)  # the leader is at least a zombie until reaped: the group id is ours
    except (ProcessLookupError, PermissionError):
        pass
    for stream in (process.stdout, process.stderr):
        if stream is not None:
            stream.close()
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    return process.returncode, usage.ru_utime + usage.ru_stime


def _describe(exit_code: int, cpu_s: float, wall_s: float, stopped: str | None, streams: _Streams,
              limits: SandboxLimits, namespaces: bool, strict: bool) -> SandboxRun:
    reports = streams.reports()
    isolation: dict[str, Any] = {"namespaces": namespaces}
    # the launcher writes the first record before the program runs; any later one may be the program's
    if reports and reports[0].get("kind") == "isolation":
        isolation.update({key: value for key, value in reports.pop(0).items() if key != "kind"})
    incomplete = not (isolation.get("landlock") and isolation.get("seccomp") and isolation.get("private_view"))
    exception = None
    for record in reports:
        if record.get("kind") == "exception":
            exception = str(record.get("type"))
    for layer, missing in (("landlock", "reads and writes outside the run directory are not prevented"),
                           ("seccomp", "new processes, sockets and calls on other processes are not prevented"),
                           ("private_view", "metadata changes are refused everywhere; the disk total is polled")):
        if namespaces and layer in isolation and not isolation[layer]:
            _warn_once(layer, f"Python sandbox: no {layer} here ({isolation.get(layer + '_error')}): {missing}")
    signal_name = None
    if exit_code < 0:
        try:
            signal_name = signal.Signals(-exit_code).name
        except ValueError:
            signal_name = f"signal {-exit_code}"
    # SIGXCPU comes only from RLIMIT_CPU (no other process may signal the run); SIGKILL follows it one CPU second
    # later when the program ignores SIGXCPU. The CPU time read at the kill can fall short of the limit.
    if stopped == "disk":
        status = "disk"
    elif signal_name == "SIGXCPU" or (signal_name == "SIGKILL" and cpu_s >= math.ceil(limits.cpu_s) - 0.05):
        status = "cpu_limit"
    elif stopped == "timeout":
        status = "timeout"
    elif signal_name is not None:
        status = "signal"
    elif strict and incomplete and exit_code == sandbox_child.STRICT_REFUSAL_EXIT_CODE and not any(
            record.get("kind") == "exception" for record in reports) and _refused_before_running(streams):
        status = "refused"
    elif exception == "MemoryError":
        status = "memory"
    elif exception is not None:
        status = "exception"
    else:
        status = "ok" if exit_code == 0 else "exit"
    return SandboxRun(
        status=status, exit_code=exit_code, stdout=streams.text("stdout", limits.output_chars),
        stderr=streams.text("stderr", limits.output_chars), stdout_bytes=streams.totals["stdout"],
        stderr_bytes=streams.totals["stderr"], wall_s=wall_s, cpu_s=cpu_s, limits=limits, exception=exception,
        signal_name=signal_name, isolation=isolation, reports=reports,
    )


def _refused_before_running(streams: _Streams) -> bool:
    """The launcher's refusal: the isolation record, then its refusal record, and nothing else."""
    return [record.get("kind") for record in streams.reports()] == ["isolation", "refused"]


def _remove_tree(directory: str) -> None:
    """Remove a run's directory even where the program took away its own permissions."""

    def make_writable_and_retry(function, path, _excinfo):
        parent = os.path.dirname(path)
        for target in (parent, path):
            try:
                os.chmod(target, stat.S_IRWXU)
            except OSError:
                pass
        try:
            function(path)
        except FileNotFoundError:
            pass

    try:
        shutil.rmtree(directory, onerror=make_writable_and_retry)
    except OSError as error:
        raise SandboxError(f"could not remove the run directory {directory}: {error}") from error
