"""The Python sandbox contains hostile programs: each one ends with a clear status, and this process lives on.

These cases are the README's adversarial table. Limits are small so the whole file runs in a few seconds.
"""

from __future__ import annotations

import concurrent.futures
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from support.signals import sigint_as_at_a_terminal

from agent_gym.tools.sandbox import (
    RUN_DIR_PREFIX,
    Sandbox,
    SandboxLimits,
    SandboxRun,
    SandboxUnavailable,
    namespace_command,
    sweep_stale_runs,
)

pytestmark = pytest.mark.skipif(not os.uname().sysname == "Linux", reason="the sandbox needs Linux")

LIMITS = SandboxLimits(wall_s=4.0, cpu_s=1.0, memory_mb=512, file_mb=1, output_chars=2_000)


@pytest.fixture(scope="module")
def sandbox() -> Sandbox:
    return Sandbox(LIMITS)


def run(sandbox: Sandbox, code: str) -> SandboxRun:
    result = sandbox.run(code)
    assert os.getpid() > 0  # this process is still here to look
    return result


def test_a_program_that_prints_finishes_ok(sandbox: Sandbox) -> None:
    result = run(sandbox, "print('hello', 6 * 7)")
    assert (result.status, result.exit_code, result.stdout) == ("ok", 0, "hello 42\n")
    assert result.observation() == "[status] finished (exit code 0)\n[stdout]\nhello 42"


def test_an_exception_shows_its_traceback_without_the_launcher(sandbox: Sandbox) -> None:
    result = run(sandbox, "def f():\n    return 1 / 0\nf()")
    assert result.status == "exception" and result.exception == "ZeroDivisionError"
    assert 'File "main.py", line 2, in f' in result.stderr
    assert "sandbox_child" not in result.stderr
    assert "raised ZeroDivisionError" in result.observation()


def test_a_syntax_error_is_reported_as_python_reports_it(sandbox: Sandbox) -> None:
    result = run(sandbox, "def f(:\n    pass")
    assert result.exception == "SyntaxError" and 'File "main.py", line 1' in result.stderr


def test_an_infinite_loop_is_stopped_at_the_cpu_limit(sandbox: Sandbox) -> None:
    result = run(sandbox, "while True:\n    pass")
    assert result.status == "cpu_limit"
    assert result.wall_s < LIMITS.wall_s
    assert "timed out" in result.summary()


def test_a_sleeping_program_is_killed_at_the_wall_clock_limit() -> None:
    result = Sandbox(SandboxLimits(wall_s=0.5, cpu_s=1.0)).run("import time\ntime.sleep(30)")
    assert result.status == "timeout" and result.wall_s < 3.0


def test_a_fork_bomb_cannot_fork(sandbox: Sandbox) -> None:
    result = run(sandbox, "import os\nwhile True:\n    os.fork()")
    assert result.status == "exception" and result.exception == "PermissionError"
    assert result.isolation["seccomp"] is True


def test_threads_still_work(sandbox: Sandbox) -> None:
    code = "from concurrent.futures import ThreadPoolExecutor\nprint(list(ThreadPoolExecutor(4).map(abs, [-1, -2])))"
    assert run(sandbox, code).stdout == "[1, 2]\n"


def test_a_thread_bomb_stops_at_the_address_space_limit(sandbox: Sandbox) -> None:
    # seccomp lets threads through (clone with CLONE_THREAD); each reserves a stack in the capped address space
    code = ("import threading, time\nstarted = 0\nwhile True:\n"
            "    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n    started += 1\n")
    result = run(sandbox, code)
    assert result.status == "exception" and result.exception == "RuntimeError"
    assert "can't start new thread" in result.stderr


def test_allocating_10_gb_raises_memory_error_inside_the_sandbox(sandbox: Sandbox) -> None:
    result = run(sandbox, "block = bytearray(10 * 1024 ** 3)")
    assert result.status == "memory" and "MemoryError" in result.stderr
    assert "512 MiB" in result.summary()


def test_writing_outside_the_run_directory_fails(sandbox: Sandbox, tmp_path: Path) -> None:
    targets = [tmp_path / "escaped.txt", Path.home() / "agent-gym-sandbox-escape.txt"]
    attempts = [f"try:\n    open({str(target)!r}, 'w').write('x')\nexcept OSError as e:\n"
                "    print(errno.errorcode[e.errno])" for target in targets]
    code = "import errno\n" + "\n".join(attempts) + "\nopen('inside.txt', 'w').write('fine')\n" \
        "print(open('inside.txt').read())"
    result = run(sandbox, code)
    *refused, inside = result.stdout.split()
    # EROFS where the mount namespace makes the outside read-only, EACCES from Landlock where there is none
    assert len(refused) == 2 and set(refused) <= {"EROFS", "EACCES"} and inside == "fine"
    assert not any(target.exists() for target in targets)


def test_the_run_directory_is_removed_afterwards(sandbox: Sandbox) -> None:
    directory = run(sandbox, "import os\nos.mkdir('sub')\nos.chmod('sub', 0)\nos.chmod('.', 0o500)\nprint(os.getcwd())")
    assert directory.stdout.strip() and not Path(directory.stdout.strip()).exists()


# An env process that runs `run_python('time.sleep(100000)')` with a wall limit far away, its runs under TMPDIR.
ENV_PROCESS = """
from agent_gym.tools.run_python import PythonTool
from agent_gym.tools.sandbox import Sandbox, SandboxLimits
PythonTool(Sandbox(SandboxLimits(wall_s={wall_s}, cpu_s=5))).run("import time\\ntime.sleep(100000)")
"""


def _children(parent: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except (OSError, ValueError):
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == parent:
            found.append(int(entry))
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _start_env_with_a_sleeping_run(tmp_path: Path, wall_s: float) -> tuple[subprocess.Popen, int, Path]:
    """The env process, its sandboxed program (once that runs) and the program's run directory."""
    env = subprocess.Popen([sys.executable, "-c", ENV_PROCESS.format(wall_s=wall_s)], env={**os.environ,
                           "TMPDIR": str(tmp_path)}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           preexec_fn=sigint_as_at_a_terminal)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        runs = list(tmp_path.glob(f"{RUN_DIR_PREFIX}*"))
        children = _children(env.pid)
        if runs and children:
            time.sleep(1.5)  # past the launcher's isolation: the program sleeps
            return env, children[0], runs[0]
        time.sleep(0.05)
    env.kill()
    pytest.fail(f"the env process never started its run: {env.stderr.read().decode() if env.poll() else ''}")


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("signal_number", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT])
def test_a_program_dies_with_the_env_process_and_its_directory_is_removed(tmp_path: Path,
                                                                         signal_number: int) -> None:
    env, program, directory = _start_env_with_a_sleeping_run(tmp_path, wall_s=1000)
    try:
        env.send_signal(signal_number)
        env.wait(timeout=30)
        assert _gone_within(program, 5.0), "the sandboxed program outlived the env process"
    finally:
        if _alive(program):
            os.kill(program, signal.SIGKILL)
        env.kill()
        env.wait()
    # Ctrl-C unwinds the run, which removes its directory; after SIGKILL or SIGTERM the next sweep does
    removed = sweep_stale_runs(str(tmp_path), min_age_s=0)
    assert not directory.exists()
    assert removed == ([] if signal_number == signal.SIGINT else [str(directory)])


def test_a_program_whose_parent_is_frozen_stops_at_its_own_wall_limit(tmp_path: Path) -> None:
    env, program, _ = _start_env_with_a_sleeping_run(tmp_path, wall_s=2)
    env.send_signal(signal.SIGSTOP)  # a parent that can no longer stop the run (stuck, or being debugged)
    try:
        assert _gone_within(program, 6.0), "the program outlived its wall limit while its parent was frozen"
    finally:
        env.send_signal(signal.SIGCONT)
        env.kill()
        env.wait()


def test_a_live_runs_directory_is_never_swept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        running = pool.submit(Sandbox(LIMITS).run, "import os, time\ntime.sleep(1.5)\nprint(os.listdir('.'))")
        while not list(tmp_path.glob(f"{RUN_DIR_PREFIX}*")) and not running.done():
            time.sleep(0.02)
        swept = sweep_stale_runs(str(tmp_path), min_age_s=0)
        result = running.result()
    assert swept == [] and result.status == "ok" and result.stdout == "['main.py']\n"


def test_a_run_directory_left_before_it_was_named_is_swept_once_stale_and_never_sooner(tmp_path: Path) -> None:
    fresh, stale = tmp_path / f".{RUN_DIR_PREFIX}fresh", tmp_path / f".{RUN_DIR_PREFIX}stale"
    fresh.mkdir()
    stale.mkdir()
    long_ago = time.time() - 3600
    os.utime(stale, (long_ago, long_ago))  # its process died between mkdtemp and the rename, an hour ago
    assert sweep_stale_runs(str(tmp_path), min_age_s=0) == [str(stale)]  # the fresh one may be a live run's
    assert fresh.is_dir() and not stale.exists()


def test_a_file_beyond_the_size_limit_cannot_be_written(sandbox: Sandbox) -> None:
    result = run(sandbox, "open('big', 'wb').write(b'x' * (2 * 1024 * 1024))")
    assert result.exception == "OSError" and "File too large" in result.stderr


def test_the_parents_environment_cannot_be_read(sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_GYM_TEST_SECRET", "hunter2")
    code = ("import os\nprint(sorted(os.environ))\n"
            f"try:\n    print(open('/proc/{os.getpid()}/environ', 'rb').read())\n"
            "except OSError as e:\n    print(type(e).__name__)")
    result = run(sandbox, code)
    assert "hunter2" not in result.stdout and "AGENT_GYM_TEST_SECRET" not in result.stdout
    assert result.stdout.splitlines()[-1] == "PermissionError"


def test_a_loopback_port_the_test_opened_cannot_be_reached(sandbox: Sandbox) -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        server.settimeout(0.2)
        port = server.getsockname()[1]
        code = (f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
                "    print('connected')\nexcept OSError as e:\n    print(type(e).__name__)")
        result = run(sandbox, code)
        with pytest.raises(TimeoutError):
            server.accept()
    assert result.stdout.strip() in ("PermissionError", "ConnectionRefusedError", "OSError")


def test_killing_the_parent_fails(sandbox: Sandbox) -> None:
    code = (f"import os, signal\nfor pid in (os.getppid(), {os.getpid()}, -1):\n    try:\n"
            "        os.kill(pid, signal.SIGKILL)\n        print('sent')\n    except OSError as e:\n"
            "        print(type(e).__name__)")
    result = run(sandbox, code)
    assert result.stdout.split() == ["PermissionError"] * 3


def test_100_mb_of_output_is_cut_and_counted(sandbox: Sandbox) -> None:
    result = run(sandbox, "import sys\nfor _ in range(100):\n    sys.stdout.write('x' * (1 << 20))")
    assert result.status == "ok" and result.stdout_bytes == 100 << 20
    assert len(result.stdout) < LIMITS.output_chars + 200 and "output cut: 104,857,600 bytes" in result.stdout


@pytest.mark.parametrize(("code", "exit_code"), [("import sys\nprint('bye')\nsys.exit(3)", 3),
                                                 ("import os\nprint('bye')\nos._exit(0)", 0)])
def test_sys_exit_and_os_exit_keep_the_output_and_the_exit_code(sandbox: Sandbox, code: str, exit_code: int) -> None:
    result = run(sandbox, code)
    assert result.exit_code == exit_code and result.stdout == "bye\n"
    assert result.status == ("ok" if exit_code == 0 else "exit")


def test_a_null_pointer_dereference_is_a_crash_with_a_python_stack(sandbox: Sandbox) -> None:
    result = run(sandbox, "import ctypes\nctypes.string_at(0)")
    assert result.status == "signal" and result.signal_name == "SIGSEGV"
    assert "crashed" in result.summary() and 'File "main.py", line 2' in result.stderr


def test_every_isolation_layer_holds_on_this_machine(sandbox: Sandbox) -> None:
    isolation = run(sandbox, "pass").isolation
    if not namespace_command():
        pytest.skip("no unprivileged user namespaces here: the documented fallback applies")
    assert isolation["namespaces"] is True and isolation["seccomp"] is True and isolation["landlock"] >= 1


def test_asserts_that_call_something_are_counted_when_they_pass() -> None:
    code = "assert True\nassert len('ab') == 2\nassert abs(-3) == 3\nassert max(1, 2) == 1\nassert min(1, 2) == 1"
    result = Sandbox(LIMITS).run(code, count_asserts=True)
    assert [record["line"] for record in result.reports if record["kind"] == "assert_passed"] == [2, 3]


def test_bad_limits_are_refused_with_the_field_named() -> None:
    with pytest.raises(ValueError, match="SandboxLimits.wall_s must be a positive number"):
        SandboxLimits(wall_s=0)


@pytest.fixture
def without_namespaces(monkeypatch: pytest.MonkeyPatch) -> None:
    """This machine as one where unprivileged user namespaces are off: `run` finds no `unshare` prefix."""
    import agent_gym.tools.sandbox as sandbox_module

    monkeypatch.setattr(sandbox_module, "namespace_command", lambda: ())
    monkeypatch.setattr(sandbox_module, "_warned", set())


def test_without_namespaces_a_loopback_port_is_still_out_of_reach_and_the_fallback_warns(without_namespaces) -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        server.settimeout(0.2)
        code = (f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {server.getsockname()[1]}), "
                "timeout=1)\n    print('connected')\nexcept OSError as e:\n    print(type(e).__name__)")
        with pytest.warns(UserWarning, match="no user/network namespace"):
            result = Sandbox(LIMITS).run(code)
        with pytest.raises(TimeoutError):
            server.accept()
    assert result.stdout.strip() == "PermissionError"  # seccomp's no-socket rule, not a namespace
    assert result.isolation["namespaces"] is False and result.isolation["seccomp"] is True


def test_without_namespaces_the_fork_bomb_and_the_parent_stay_contained(without_namespaces) -> None:
    with pytest.warns(UserWarning):
        forked = Sandbox(LIMITS).run("import os\nwhile True:\n    os.fork()")
        killed = Sandbox(LIMITS).run(f"import os, signal\nos.kill({os.getpid()}, signal.SIGKILL)")
    assert forked.status == "exception" and forked.exception == "PermissionError"
    assert killed.status == "exception" and killed.exception == "PermissionError"


def test_a_strict_sandbox_refuses_to_run_without_namespaces(without_namespaces) -> None:
    with pytest.raises(SandboxUnavailable, match="no network namespace"):
        Sandbox(LIMITS, strict=True).run("print('never runs')")
