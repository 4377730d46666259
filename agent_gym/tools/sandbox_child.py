"""The first code a sandboxed run executes: it locks the process down, then runs ``main.py``.

:class:`agent_gym.tools.sandbox.Sandbox` starts this file as a script (``python -I``, so nothing of agent-gym or
of the caller's environment is imported) in a fresh temporary directory. Before the untrusted program runs, it
applies, in order:

1. resource limits: CPU seconds, address space, file size, no core files;
2. Landlock (Linux >= 5.13): the file system is writable only inside the run's directory (and ``/dev/null``);
   other processes cannot be traced (``/proc/PID/environ``, ``/proc/PID/mem``); with ABI >= 4 no TCP connect or
   bind, with ABI >= 6 no signal to a process outside the sandbox;
3. seccomp (x86_64, aarch64): no new process (``fork``, ``vfork``, ``clone`` of a process; threads are
   allowed), no socket (``socketpair`` is allowed), no signal but to itself, no ``ptrace``, no ``io_uring``.

It writes one JSON line saying which layers hold to the report pipe (``REPORT_FD``), runs the program as
``__main__`` and, when the program raises, prints the traceback without this file's frames and reports the
exception's type. Only the standard library is used here: this runs before anything of the program.
"""

import ctypes
import faulthandler
import json
import os
import resource
import signal
import struct
import sys
import types

# ast and traceback are imported only when needed: every import here delays every run (measured: ~7 ms for ast)

REPORT_FD = 3
STRICT_REFUSAL_EXIT_CODE = 97
ASSERT_HOOK = "__agent_gym_assert_passed__"

# ---------------------------------------------------------------------------------------------- Landlock
# Kernel ABI (include/uapi/linux/landlock.h); the syscall numbers are the same on every architecture.
_SYS_LANDLOCK_CREATE_RULESET, _SYS_LANDLOCK_ADD_RULE, _SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
_LANDLOCK_CREATE_RULESET_VERSION = 1
_LANDLOCK_RULE_PATH_BENEATH = 1
_FS_WRITE_FILE = 1 << 1
_FS_REMOVE_DIR, _FS_REMOVE_FILE = 1 << 4, 1 << 5
_FS_MAKE_ANY = sum(1 << bit for bit in range(6, 13))  # char, dir, reg, sock, fifo, block, sym
_FS_REFER, _FS_TRUNCATE = 1 << 13, 1 << 14  # ABI 2, ABI 3
_NET_BIND_TCP, _NET_CONNECT_TCP = 1 << 0, 1 << 1  # ABI 4
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1 << 0, 1 << 1  # ABI 6
_PR_SET_NO_NEW_PRIVS = 38

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
# prctl refuses (EINVAL) unused arguments that are not zero: pass every argument as a full unsigned long
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]


def _prctl(option, argument, pointer=0):
    if _libc.prctl(option, argument, pointer, 0, 0) != 0:
        error = ctypes.get_errno()
        raise OSError(error, os.strerror(error))


def _syscall(number, *args):
    result = _libc.syscall(ctypes.c_long(number), *args)
    if result < 0:
        error = ctypes.get_errno()
        raise OSError(error, os.strerror(error))
    return result


def apply_landlock(writable_dirs, writable_files):
    """Allow writes only beneath ``writable_dirs`` and to ``writable_files``; returns the Landlock ABI used."""
    abi = _syscall(_SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0),
                   ctypes.c_uint32(_LANDLOCK_CREATE_RULESET_VERSION))
    fs_rights = _FS_WRITE_FILE | _FS_REMOVE_DIR | _FS_REMOVE_FILE | _FS_MAKE_ANY
    fs_rights |= (_FS_REFER if abi >= 2 else 0) | (_FS_TRUNCATE if abi >= 3 else 0)
    net_rights = _NET_BIND_TCP | _NET_CONNECT_TCP if abi >= 4 else 0  # no rule allows a port: all are denied
    scopes = _SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL if abi >= 6 else 0
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    attr = ctypes.create_string_buffer(struct.pack("<QQQ", fs_rights, net_rights, scopes)[:size], size)
    ruleset = _syscall(_SYS_LANDLOCK_CREATE_RULESET, attr, ctypes.c_size_t(size), ctypes.c_uint32(0))
    try:
        file_rights = _FS_WRITE_FILE | (_FS_TRUNCATE if abi >= 3 else 0)
        for paths, rights in ((writable_dirs, fs_rights), (writable_files, file_rights)):
            for path in paths:
                descriptor = os.open(path, os.O_PATH | os.O_CLOEXEC)
                try:
                    rule = ctypes.create_string_buffer(struct.pack("<Qi", rights, descriptor), 12)  # packed struct
                    _syscall(_SYS_LANDLOCK_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(_LANDLOCK_RULE_PATH_BENEATH),
                             rule, ctypes.c_uint32(0))
                finally:
                    os.close(descriptor)
        _prctl(_PR_SET_NO_NEW_PRIVS, 1)
        _syscall(_SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0))
    finally:
        os.close(ruleset)
    return abi


# ---------------------------------------------------------------------------------------------- seccomp
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_SYSCALLS = {  # arch/x86/entry/syscalls/syscall_64.tbl and include/uapi/asm-generic/unistd.h
    "x86_64": {"socket": 41, "clone": 56, "fork": 57, "vfork": 58, "kill": 62, "ptrace": 101,
               "rt_sigqueueinfo": 129, "tkill": 200, "tgkill": 234, "rt_tgsigqueueinfo": 297,
               "process_vm_readv": 310, "process_vm_writev": 311, "pidfd_send_signal": 424,
               "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "clone3": 435},
    "aarch64": {"socket": 198, "clone": 220, "kill": 129, "ptrace": 117, "rt_sigqueueinfo": 138, "tkill": 130,
                "tgkill": 131, "rt_tgsigqueueinfo": 240, "process_vm_readv": 270, "process_vm_writev": 271,
                "pidfd_send_signal": 424, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
                "clone3": 435},
}
# What each listed syscall gets. clone3 passes its flags in memory that seccomp cannot read, so it answers
# ENOSYS and the C library falls back to clone, whose flags seccomp can check.
_RULES = {
    "fork": "deny", "vfork": "deny", "clone": "threads_only", "clone3": "no_such_call", "socket": "deny",
    "kill": "self_or_group", "tgkill": "self", "rt_sigqueueinfo": "self", "rt_tgsigqueueinfo": "self",
    "tkill": "deny", "pidfd_send_signal": "deny", "ptrace": "deny", "process_vm_readv": "deny",
    "process_vm_writev": "deny", "io_uring_setup": "deny", "io_uring_enter": "deny", "io_uring_register": "deny",
}
_LD_W_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_RET_ALLOW, _RET_KILL_PROCESS, _RET_ERRNO = 0x7FFF0000, 0x80000000, 0x00050000
_EPERM, _ENOSYS = 1, 38
_CLONE_THREAD = 0x00010000
_X32_SYSCALL_BIT = 0x40000000
_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 22, 2
_ARG0_LOW = 16  # offsetof(struct seccomp_data, args[0]); the low 32 bits on a little-endian machine


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def _assemble(program):
    """Resolve ``("label", name)`` entries and label jump targets into a BPF instruction array."""
    positions, index = {}, 0
    for item in program:
        if item[0] == "label":
            positions[item[1]] = index
        else:
            index += 1
    instructions, index = [], 0
    for item in program:
        if item[0] == "label":
            continue
        code, k, jt, jf = item

        def offset(target, here=index):
            if target is None:
                return 0
            assert 0 <= positions[target] - here - 1 <= 255, "BPF jumps only forward, at most 255 instructions"
            return positions[target] - here - 1

        instructions.append(_SockFilter(code, offset(jt), offset(jf), k))
        index += 1
    return (_SockFilter * len(instructions))(*instructions)


def apply_seccomp():
    """Install the filter described by ``_RULES``; raises OSError where the machine cannot."""
    machine = os.uname().machine.lower()
    machine = {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)
    if machine not in _SYSCALLS:
        raise OSError(f"no seccomp syscall table for {machine}")
    numbers, own_pid = _SYSCALLS[machine], os.getpid()
    program = [(_LD_W_ABS, 4, None, None), (_JEQ, _AUDIT_ARCH[machine], None, "kill"), (_LD_W_ABS, 0, None, None)]
    if machine == "x86_64":  # x32 system calls are the same calls under other numbers
        program.append((_JGE, _X32_SYSCALL_BIT, "deny", None))
    for name, action in _RULES.items():
        if name in numbers:
            program.append((_JEQ, numbers[name], action, None))
    program += [  # BPF jumps only forward: the argument checks first, the verdicts last
        (_RET, _RET_ALLOW, None, None),
        ("label", "threads_only"), (_LD_W_ABS, _ARG0_LOW, None, None), (_JSET, _CLONE_THREAD, "allow", "deny"),
        ("label", "self_or_group"), (_LD_W_ABS, _ARG0_LOW, None, None), (_JEQ, 0, "allow", "self"),
        ("label", "self"), (_LD_W_ABS, _ARG0_LOW, None, None), (_JEQ, own_pid, "allow", "deny"),
        ("label", "allow"), (_RET, _RET_ALLOW, None, None),
        ("label", "kill"), (_RET, _RET_KILL_PROCESS, None, None),
        ("label", "deny"), (_RET, _RET_ERRNO | _EPERM, None, None),
        ("label", "no_such_call"), (_RET, _RET_ERRNO | _ENOSYS, None, None),
    ]
    filters = _assemble(program)
    fprog = _SockFprog(len(filters), ctypes.cast(filters, ctypes.POINTER(_SockFilter)))
    _prctl(_PR_SET_NO_NEW_PRIVS, 1)
    _prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.addressof(fprog))


# ---------------------------------------------------------------------------------------------- the run


def _report(record):
    try:
        os.write(REPORT_FD, (json.dumps(record) + "\n").encode())
    except OSError:
        pass  # the program closed the pipe: the parent reads what came through


def _apply_limits(config):
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    cpu = int(config["cpu_s"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))  # SIGXCPU at the soft limit, SIGKILL a second later
    resource.setrlimit(resource.RLIMIT_FSIZE, (config["file_bytes"], config["file_bytes"]))
    resource.setrlimit(resource.RLIMIT_AS, (config["memory_bytes"], config["memory_bytes"]))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a too-large write raises OSError (EFBIG) instead of killing


def _isolate(config):
    layers = {}
    try:
        layers["landlock"] = apply_landlock([os.getcwd()], ["/dev/null"])
    except (OSError, AttributeError) as error:
        layers["landlock"] = 0
        layers["landlock_error"] = str(error)
    try:
        apply_seccomp()
        layers["seccomp"] = True
    except (OSError, AttributeError) as error:
        layers["seccomp"] = False
        layers["seccomp_error"] = str(error)
    return layers


def _count_passed_asserts(source, filename):
    """The program's syntax tree with, after each module-level ``assert`` that calls something, a call that
    records that it passed (the progress of test-driven coding)."""
    import ast

    tree = ast.parse(source, filename)
    body = []
    for statement in tree.body:
        body.append(statement)
        test = getattr(statement, "test", None)
        if isinstance(statement, ast.Assert) and not isinstance(test, ast.Constant) and any(
                isinstance(node, ast.Call) for node in ast.walk(test)):
            hook = ast.Expr(ast.Call(ast.Name(ASSERT_HOOK, ast.Load()), [ast.Constant(statement.lineno)], []))
            body.append(ast.copy_location(hook, statement))
    tree.body = body
    return ast.fix_missing_locations(tree)


def _print_user_traceback(error):
    """The traceback as Python prints it, without this launcher's own frames."""
    import traceback

    tb = error.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    sys.stderr.write("".join(traceback.format_exception(type(error), error, tb)))


def main():
    config = json.loads(sys.argv[1])
    if config["report_fd"] != REPORT_FD:  # the program finds its report pipe at a fixed number
        os.dup2(config["report_fd"], REPORT_FD)
        os.close(config["report_fd"])
    with open(config["main"], encoding="utf-8") as handle:
        source = handle.read()
    _apply_limits(config)
    faulthandler.enable()  # a C-level crash prints the Python stack before the process dies
    layers = _isolate(config)
    _report({"kind": "isolation", **layers})
    if config.get("strict") and not (layers["landlock"] and layers["seccomp"]):
        _report({"kind": "refused"})
        sys.stderr.write(f"sandbox refused to run: isolation incomplete: {layers}\n")
        return STRICT_REFUSAL_EXIT_CODE

    module = types.ModuleType("__main__")
    module.__file__ = config["main"]
    module.__builtins__ = __builtins__
    passed_lines = set()

    def assert_passed(line):
        if line not in passed_lines:
            passed_lines.add(line)
            _report({"kind": "assert_passed", "line": line})

    setattr(module, ASSERT_HOOK, assert_passed)
    sys.modules["__main__"] = module
    sys.argv = [config["main"]]
    sys.path.insert(0, os.getcwd())
    try:
        program = _count_passed_asserts(source, config["main"]) if config.get("count_asserts") else source
        code = compile(program, config["main"], "exec")
    except (SyntaxError, ValueError) as error:  # ValueError: null bytes in the source
        import traceback

        sys.stderr.write("".join(traceback.format_exception_only(type(error), error)))
        _report({"kind": "exception", "type": type(error).__name__})
        return 1
    del source, program, config
    try:
        exec(code, module.__dict__)
    except SystemExit:
        raise  # the interpreter prints its message and exits with its code, as for any program
    except BaseException as error:  # noqa: BLE001 - this is the program's top level
        _print_user_traceback(error)
        _report({"kind": "exception", "type": type(error).__name__})
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
