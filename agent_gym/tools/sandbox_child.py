"""The first code a sandboxed run executes: it locks the process down, then runs ``main.py``.

:class:`agent_gym.tools.sandbox.Sandbox` starts this file as a script (``python -I``, so nothing of agent-gym or
of the caller's environment is imported) in a fresh temporary directory. Before the untrusted program runs, it
applies, in order:

1. resource limits: CPU seconds, address space, file size, open files, no core files, no message queues;
2. a private view of the file system (where user namespaces work): a new user and mount namespace in which
   every mount is read-only, metadata included, and the run's directory is a fresh ``tmpfs`` of ``disk_bytes``
   (a total cap on disk), holding a copy of the files the parent wrote;
3. Landlock (Linux >= 5.13): reads only beneath the interpreter's standard library (its ``site-packages`` only
   when the run allows installed packages), the system's shared libraries and the run's directory; writes only
   in the run's directory (and ``/dev/null``); nothing executed; other processes cannot be traced; with
   ABI >= 4 no TCP connect or bind, with ABI >= 6 no signal to a process outside the sandbox;
4. seccomp (x86_64, aarch64): no new process (``fork``, ``vfork``, ``clone`` of a process; threads are
   allowed), no ``execve``, no socket (``socketpair`` is allowed), no signal but to itself, no ``ptrace``, no
   ``io_uring``; no signal-driven I/O aimed elsewhere (``fcntl`` ``F_SETOWN``, ``F_SETOWN_EX``, ``F_SETSIG``,
   ``ioctl`` ``FIOSETOWN``/``SIOCSPGRP``: the kernel would signal the owner it names); calls that name a process
   (``prlimit``, ``setpriority``, ``sched_setaffinity``, ``sched_setscheduler``...) work only on itself; no
   memory outside the address-space limit (``memfd_create``, SysV shared memory, pipe resizing); no mount or
   namespace changes; without the private view of step 2, no metadata change anywhere (``chmod``, ``chown``,
   ``utime``, extended attributes);
5. a life no longer than its parent's and its wall limit: the kernel sends ``SIGKILL`` when the process that
   started it dies (``PR_SET_PDEATHSIG``; the launcher exits at once if that parent is already gone), and a
   timer of its own sends ``SIGKILL`` a little after ``wall_s`` even if no parent is there to stop it; seccomp
   keeps the program from clearing either (``prctl(PR_SET_PDEATHSIG)``, ``timer_settime``/``timer_delete`` of
   that timer).

The first line on the report pipe (``REPORT_FD``) is this launcher's: which layers hold. The parent reads
isolation from that line only, since everything after it may come from the program. It then runs the program
as ``__main__`` and, when the program raises, prints the traceback without this file's frames and reports the
exception's type. Only the standard library is used here: this runs before anything of the program.
"""

import ctypes
import faulthandler
import fcntl
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
_OPEN_FILES = 256
ASSERT_HOOK = "__agent_gym_assert_passed__"
VALUE_HOOK = "__agent_gym_assert_value__"
_ENCODED_CHARS = 100_000  # an assert's values beyond this are not sent (the assert then counts for nothing)

# ---------------------------------------------------------------------------------------------- Landlock
# Kernel ABI (include/uapi/linux/landlock.h); the syscall numbers are the same on every architecture.
_SYS_LANDLOCK_CREATE_RULESET, _SYS_LANDLOCK_ADD_RULE, _SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
_LANDLOCK_CREATE_RULESET_VERSION = 1
_LANDLOCK_RULE_PATH_BENEATH = 1
_FS_EXECUTE, _FS_WRITE_FILE, _FS_READ_FILE, _FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
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


def apply_landlock(writable_dirs, writable_files, readable, listable=()):
    """Allow writes only beneath ``writable_dirs`` and to ``writable_files``, reads only there and beneath
    ``readable``, directory listings also in ``listable`` (but not beneath), and no execution; returns the ABI."""
    abi = _syscall(_SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0),
                   ctypes.c_uint32(_LANDLOCK_CREATE_RULESET_VERSION))
    read_rights = _FS_READ_FILE | _FS_READ_DIR
    fs_rights = _FS_EXECUTE | read_rights | _FS_WRITE_FILE | _FS_REMOVE_DIR | _FS_REMOVE_FILE | _FS_MAKE_ANY
    fs_rights |= (_FS_REFER if abi >= 2 else 0) | (_FS_TRUNCATE if abi >= 3 else 0)
    net_rights = _NET_BIND_TCP | _NET_CONNECT_TCP if abi >= 4 else 0  # no rule allows a port: all are denied
    scopes = _SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL if abi >= 6 else 0
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    attr = ctypes.create_string_buffer(struct.pack("<QQQ", fs_rights, net_rights, scopes)[:size], size)
    ruleset = _syscall(_SYS_LANDLOCK_CREATE_RULESET, attr, ctypes.c_size_t(size), ctypes.c_uint32(0))
    try:
        file_rights = _FS_READ_FILE | _FS_WRITE_FILE | (_FS_TRUNCATE if abi >= 3 else 0)
        rules = [(path, fs_rights & ~_FS_EXECUTE) for path in writable_dirs]
        rules += [(path, file_rights) for path in writable_files]
        rules += [(path, read_rights) for path in readable] + [(path, _FS_READ_DIR) for path in listable]
        for path, rights in rules:
            try:
                descriptor = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue  # a library folder this machine lacks
            try:
                if not os.path.isdir(path):
                    rights &= _FS_EXECUTE | _FS_WRITE_FILE | _FS_READ_FILE | _FS_TRUNCATE  # file rights only
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


# What every program may read besides its own directory: the dynamic loader's cache and the system's shared
# libraries (extension modules link against them), time zones, and the devices Python opens.
_SYSTEM_READABLE = ("/etc/ld.so.cache", "/lib", "/lib64", "/usr/lib", "/usr/lib64", "/usr/local/lib",
                    "/etc/localtime", "/usr/share/zoneinfo", "/dev/urandom", "/dev/zero")


def readable_paths(site_packages):
    """(paths readable beneath, folders listable only): the interpreter's import path and the system's
    libraries. Without ``site_packages``, the standard library's own ``site-packages`` stays unreadable."""
    readable, listable = list(_SYSTEM_READABLE), []
    for entry in sys.path:
        if not entry or not os.path.exists(entry) or os.path.realpath(entry) == os.path.realpath(os.getcwd()):
            continue
        if site_packages or not os.path.isdir(os.path.join(entry, "site-packages")):
            readable.append(entry)
            continue
        listable.append(entry)  # the standard library: every entry but site-packages
        readable += [os.path.join(entry, name) for name in os.listdir(entry) if name != "site-packages"]
    return readable, listable


# ---------------------------------------------------------------------------------------------- seccomp
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_MACHINES = ("x86_64", "aarch64")
# arch/x86/entry/syscalls/syscall_64.tbl and include/uapi/asm-generic/unistd.h: (x86_64, aarch64); None where
# the architecture has no such call (aarch64 has only the *at forms)
_SYSCALL_NUMBERS = {
    "socket": (41, 198), "clone": (56, 220), "fork": (57, None), "vfork": (58, None), "kill": (62, 129),
    "ptrace": (101, 117), "rt_sigqueueinfo": (129, 138), "tkill": (200, 130), "tgkill": (234, 131),
    "rt_tgsigqueueinfo": (297, 240), "process_vm_readv": (310, 270), "process_vm_writev": (311, 271),
    "pidfd_send_signal": (424, 424), "io_uring_setup": (425, 425), "io_uring_enter": (426, 426),
    "io_uring_register": (427, 427), "clone3": (435, 435), "execve": (59, 221), "execveat": (322, 281),
    # calls that name a process
    "prlimit64": (302, 261), "sched_setparam": (142, 118), "sched_getparam": (143, 121),
    "sched_setscheduler": (144, 119), "sched_getscheduler": (145, 120), "sched_rr_get_interval": (148, 127),
    "sched_setaffinity": (203, 122), "sched_getaffinity": (204, 123), "sched_setattr": (314, 274),
    "sched_getattr": (315, 275), "migrate_pages": (256, 238), "move_pages": (279, 239),
    "get_robust_list": (274, 100), "getpgid": (121, 155), "getsid": (124, 156), "setpgid": (109, 154),
    "setpriority": (141, 140), "getpriority": (140, 141), "ioprio_set": (251, 30), "ioprio_get": (252, 31),
    "kcmp": (312, 272), "pidfd_open": (434, 434), "pidfd_getfd": (438, 438), "process_madvise": (440, 440),
    "process_mrelease": (448, 448), "perf_event_open": (298, 241),
    # memory outside RLIMIT_AS, and state that outlives the process
    "memfd_create": (319, 279), "memfd_secret": (447, 447), "shmget": (29, 194), "msgget": (68, 186),
    "semget": (64, 190), "mq_open": (240, 180), "fcntl": (72, 25), "userfaultfd": (323, 282), "bpf": (321, 280),
    "add_key": (248, 217), "request_key": (249, 218), "keyctl": (250, 219), "syslog": (103, 116),
    # the file system's shape
    "mount": (165, 40), "umount2": (166, 39), "pivot_root": (155, 41), "chroot": (161, 51),
    "unshare": (272, 97), "setns": (308, 268), "mount_setattr": (442, 442), "open_tree": (428, 428),
    "move_mount": (429, 429), "fsopen": (430, 430), "fsconfig": (431, 431), "fsmount": (432, 432),
    "fspick": (433, 433),
    # signal-driven I/O and the process's own life
    "ioctl": (16, 29), "prctl": (157, 167), "timer_settime": (223, 110), "timer_delete": (226, 111),
    # metadata: refused only where the read-only view of the file system is missing
    "chmod": (90, None), "fchmod": (91, 52), "fchmodat": (268, 53), "fchmodat2": (452, 452),
    "chown": (92, None), "fchown": (93, 55), "lchown": (94, None), "fchownat": (260, 54), "utime": (132, None),
    "utimes": (235, None), "futimesat": (261, None), "utimensat": (280, 88), "setxattr": (188, 5),
    "lsetxattr": (189, 6), "fsetxattr": (190, 7), "removexattr": (197, 14), "lremovexattr": (198, 15),
    "fremovexattr": (199, 16), "setxattrat": (463, 463), "removexattrat": (466, 466),
}
_METADATA_CALLS = ("chmod", "fchmod", "fchmodat", "fchmodat2", "chown", "fchown", "lchown", "fchownat", "utime",
                   "utimes", "futimesat", "utimensat", "setxattr", "lsetxattr", "fsetxattr", "removexattr",
                   "lremovexattr", "fremovexattr", "setxattrat", "removexattrat")
_DENIED = ("fork", "vfork", "socket", "tkill", "pidfd_send_signal", "ptrace", "process_vm_readv",
           "process_vm_writev", "io_uring_setup", "io_uring_enter", "io_uring_register", "execve", "execveat",
           "kcmp", "pidfd_open", "pidfd_getfd", "process_madvise", "process_mrelease", "perf_event_open",
           "memfd_create", "memfd_secret", "shmget", "msgget", "semget", "mq_open", "userfaultfd", "bpf",
           "add_key", "request_key", "keyctl", "syslog", "mount", "umount2", "pivot_root", "chroot", "unshare",
           "setns", "mount_setattr", "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick")
_ON_ITSELF = ("prlimit64", "sched_setparam", "sched_getparam", "sched_setscheduler", "sched_getscheduler",
              "sched_rr_get_interval", "sched_setaffinity", "sched_getaffinity", "sched_setattr", "sched_getattr",
              "migrate_pages", "move_pages", "get_robust_list", "getpgid", "getsid", "setpgid")
# What each listed syscall gets. clone3 passes its flags in memory that seccomp cannot read, so it answers
# ENOSYS and the C library falls back to clone, whose flags seccomp can check. A process is named by its first
# argument (0 or its own pid: "self_or_zero"); priorities by (which, who) where only PRIO_PROCESS (0), or
# IOPRIO_WHO_PROCESS (1), of itself is allowed: PRIO_USER would reach every process of the user.
_RULES = {
    **{name: "deny" for name in _DENIED},
    **{name: "self_or_zero" for name in _ON_ITSELF},
    "clone": "threads_only", "clone3": "no_such_call", "kill": "self_or_group", "tgkill": "self",
    "rt_sigqueueinfo": "self", "rt_tgsigqueueinfo": "self", "setpriority": "priority_of_self",
    "getpriority": "priority_of_self", "ioprio_set": "io_priority_of_self", "ioprio_get": "io_priority_of_self",
    "fcntl": "fcntl_allowed", "ioctl": "ioctl_allowed", "prctl": "prctl_allowed",
    "timer_settime": "not_the_wall_timer", "timer_delete": "not_the_wall_timer",
}
# fcntl commands refused: a pipe resize (memory outside RLIMIT_AS); F_SETOWN, F_SETOWN_EX and F_SETSIG, which
# make the kernel signal the process (group) they name when I/O is ready, past seccomp's rules on kill().
_F_SETOWN, _F_SETSIG, _F_SETOWN_EX, _F_SETPIPE_SZ = 8, 10, 15, 1031
_FIOSETOWN, _SIOCSPGRP = 0x8901, 0x8902  # the same owner, set through ioctl on a socket (socketpair is allowed)
_PR_SET_PDEATHSIG = 1
_LD_W_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_RET_ALLOW, _RET_KILL_PROCESS, _RET_ERRNO = 0x7FFF0000, 0x80000000, 0x00050000
_EPERM, _ENOSYS = 1, 38
_CLONE_THREAD = 0x00010000
_X32_SYSCALL_BIT = 0x40000000
_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 22, 2
_ARG0_LOW, _ARG1_LOW = 16, 24  # offsetof(struct seccomp_data, args[i]); the low 32 bits (little-endian): pid_t
_SYS_TIMER_CREATE = {"x86_64": 222, "aarch64": 107}
_SYS_TIMER_SETTIME = {"x86_64": 223, "aarch64": 110}
_CLOCK_MONOTONIC, _SIGEV_SIGNAL = 1, 0
_WALL_GRACE_S = 1.0  # the parent stops the run at wall_s; the run's own timer only when no parent did



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


def _machine():
    machine = os.uname().machine.lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)


def apply_seccomp(metadata=True, wall_timer=-1):
    """Install the filter described by ``_RULES`` (and, unless ``metadata``, refuse every metadata change);
    ``wall_timer`` is the id of the timer that ends the run, which the program may not change or delete.
    Raises OSError where the machine cannot."""
    machine = _machine()
    if machine not in _AUDIT_ARCH:
        raise OSError(f"no seccomp syscall table for {machine}")
    column, own_pid = _MACHINES.index(machine), os.getpid()
    rules = dict(_RULES, **({} if metadata else {name: "deny" for name in _METADATA_CALLS}))
    program = [(_LD_W_ABS, 4, None, None), (_JEQ, _AUDIT_ARCH[machine], None, "kill"), (_LD_W_ABS, 0, None, None)]
    if machine == "x86_64":  # x32 system calls are the same calls under other numbers
        program.append((_JGE, _X32_SYSCALL_BIT, "deny", None))
    for name, action in rules.items():
        number = _SYSCALL_NUMBERS[name][column]
        if number is not None:
            program.append((_JEQ, number, action, None))
    program += [  # BPF jumps only forward: the argument checks first, the verdicts last
        (_RET, _RET_ALLOW, None, None),
        ("label", "threads_only"), (_LD_W_ABS, _ARG0_LOW, None, None), (_JSET, _CLONE_THREAD, "allow", "deny"),
        ("label", "fcntl_allowed"), (_LD_W_ABS, _ARG1_LOW, None, None), (_JEQ, _F_SETPIPE_SZ, "deny", None),
        (_JEQ, _F_SETOWN, "deny", None), (_JEQ, _F_SETOWN_EX, "deny", None), (_JEQ, _F_SETSIG, "deny", "allow"),
        ("label", "ioctl_allowed"), (_LD_W_ABS, _ARG1_LOW, None, None), (_JEQ, _FIOSETOWN, "deny", None),
        (_JEQ, _SIOCSPGRP, "deny", "allow"),
        ("label", "prctl_allowed"), (_LD_W_ABS, _ARG0_LOW, None, None), (_JEQ, _PR_SET_PDEATHSIG, "deny", "allow"),
        ("label", "not_the_wall_timer"), (_LD_W_ABS, _ARG0_LOW, None, None),
        (_JEQ, wall_timer & 0xFFFFFFFF, "deny", "allow"),
        ("label", "priority_of_self"), (_LD_W_ABS, _ARG0_LOW, None, None), (_JEQ, 0, "who_is_self", "deny"),
        ("label", "io_priority_of_self"), (_LD_W_ABS, _ARG0_LOW, None, None), (_JEQ, 1, "who_is_self", "deny"),
        ("label", "who_is_self"), (_LD_W_ABS, _ARG1_LOW, None, None), (_JEQ, 0, "allow", None),
        (_JEQ, own_pid, "allow", "deny"),
        ("label", "self_or_group"), (_LD_W_ABS, _ARG0_LOW, None, None), (_JEQ, 0, "allow", "self"),
        ("label", "self_or_zero"), (_LD_W_ABS, _ARG0_LOW, None, None), (_JEQ, 0, "allow", "self"),
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


# ---------------------------------------------------------------------------------------------- private view
_CLONE_NEWNS, _CLONE_NEWUSER = 0x00020000, 0x10000000
_SYS_MOUNT_SETATTR = 442
_AT_FDCWD, _AT_RECURSIVE = -100, 0x8000
_MOUNT_ATTR_RDONLY = 0x1
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 0x2, 0x4, 0x8
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]


def _mount_attr(path, attr_set, attr_clr, flags):
    attr = ctypes.create_string_buffer(struct.pack("<QQQQ", attr_set, attr_clr, 0, 0), 32)
    _syscall(_SYS_MOUNT_SETATTR, ctypes.c_int(_AT_FDCWD), os.fsencode(path), ctypes.c_uint(flags), attr,
             ctypes.c_size_t(32))


def _write_file(path, text):
    with open(path, "w") as handle:
        handle.write(text)


def apply_private_view(disk_bytes):
    """Enter a new user and mount namespace where every mount is read-only (metadata included) and the run's
    directory is a fresh tmpfs of ``disk_bytes`` holding a copy of its files."""
    uid, gid, directory = os.geteuid(), os.getegid(), os.getcwd()
    files = {}
    for entry in os.scandir(directory):
        if entry.is_file(follow_symlinks=False):
            with open(entry.path, "rb") as handle:
                files[entry.name] = handle.read()
    if _libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNS) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"unshare: {os.strerror(error)}")
    _write_file("/proc/self/setgroups", "deny")
    _write_file("/proc/self/uid_map", f"{uid} {uid} 1")
    _write_file("/proc/self/gid_map", f"{gid} {gid} 1")
    _mount_attr("/", _MOUNT_ATTR_RDONLY, 0, _AT_RECURSIVE)
    options = f"size={max(disk_bytes, 4096)},mode=0700,uid={uid},gid={gid}".encode()
    if _libc.mount(b"tmpfs", os.fsencode(directory), b"tmpfs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, options) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"mount tmpfs: {os.strerror(error)}")
    os.chdir(directory)  # the old cwd is the folder under the new mount
    for name, data in files.items():
        with open(name, "wb") as handle:
            handle.write(data)


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
    resource.setrlimit(resource.RLIMIT_NOFILE, (_OPEN_FILES, _OPEN_FILES))  # bounds pipe and socket buffers
    resource.setrlimit(resource.RLIMIT_MSGQUEUE, (0, 0))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a too-large write raises OSError (EFBIG) instead of killing


def _tie_life_to_parent(parent_pid):
    """SIGKILL when the process that started this one dies (checked once after, for a parent already gone)."""
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:
        os._exit(STRICT_REFUSAL_EXIT_CODE)  # the parent died before the line above: nobody waits for this run


def _start_wall_timer(wall_s):
    """A timer that sends this process SIGKILL after ``wall_s`` seconds, whatever its parent does; its id."""
    machine = _machine()
    if machine not in _SYS_TIMER_CREATE:
        raise OSError(f"no timer syscall numbers for {machine}")
    event = ctypes.create_string_buffer(struct.pack("<qii", 0, signal.SIGKILL, _SIGEV_SIGNAL) + bytes(48), 64)
    timer = ctypes.c_int(-1)
    _syscall(_SYS_TIMER_CREATE[machine], ctypes.c_long(_CLOCK_MONOTONIC), event, ctypes.byref(timer))
    seconds = max(wall_s, 0.001)
    spec = ctypes.create_string_buffer(struct.pack("<qqqq", 0, 0, int(seconds), int(seconds % 1 * 1e9)), 32)
    _syscall(_SYS_TIMER_SETTIME[machine], ctypes.c_long(timer.value), ctypes.c_long(0), spec, None)
    return timer.value


def _isolate(config):
    layers = {}
    if config.get("private_view"):
        try:
            apply_private_view(config["disk_bytes"])
            layers["private_view"] = True
        except (OSError, AttributeError) as error:
            layers["private_view"] = False
            layers["private_view_error"] = str(error)
    else:
        layers["private_view"] = False
        layers["private_view_error"] = "no user namespace"
    try:
        readable, listable = readable_paths(config.get("site_packages"))
        layers["landlock"] = apply_landlock([os.getcwd()], ["/dev/null"], readable, listable)
    except (OSError, AttributeError) as error:
        layers["landlock"] = 0
        layers["landlock_error"] = str(error)
    # after the namespaces and Landlock (credential changes), before seccomp (which then guards both)
    wall_timer = -1
    try:
        _tie_life_to_parent(config["parent_pid"])
        wall_timer = _start_wall_timer(config["wall_s"] + _WALL_GRACE_S)
        layers["lifetime"] = True
    except (OSError, KeyError) as error:
        layers["lifetime"] = False
        layers["lifetime_error"] = str(error)
    try:
        apply_seccomp(metadata=layers["private_view"], wall_timer=wall_timer)
        layers["seccomp"] = True
    except (OSError, AttributeError) as error:
        layers["seccomp"] = False
        layers["seccomp_error"] = str(error)
    return layers


def counted_assert_lines(source):
    """The lines of ``source``'s module-level asserts that count as progress: each calls something and is not a
    constant. The parent computes them too, so a program cannot report an assert it does not hold."""
    return set(assert_plans(source))


def assert_plans(source):
    """For each counted assert's line, how its verdict follows from its operands: ``(kind, ops, operands)``
    where kind is ``compare`` (ops: the comparison operators' names), ``not`` or ``truth``, and each operand is
    ``("literal", value)`` (the source's own) or ``("reported", index)`` (a value the program sends). The
    parent recomputes the verdict from these, so a record of a pass without values that satisfy the assert
    counts for nothing."""
    import ast

    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return {}
    plans = {}
    for statement in tree.body:
        if not _counts(statement):
            continue
        test = statement.test
        if isinstance(test, ast.Compare):
            kind, ops, nodes = "compare", tuple(type(op).__name__ for op in test.ops), [test.left, *test.comparators]
        elif isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            kind, ops, nodes = "not", (), [test.operand]
        else:
            kind, ops, nodes = "truth", (), [test]
        operands = []
        for index, node in enumerate(nodes):
            literal = _literal(node)
            operands.append(("reported", index) if literal is _NOT_LITERAL else ("literal", literal))
        plans[statement.lineno] = (kind, ops, tuple(operands))
    return plans


_NOT_LITERAL = object()


def _literal(node):
    import ast

    if not isinstance(node, (ast.Constant, ast.UnaryOp, ast.Tuple, ast.List, ast.Set, ast.Dict)):
        return _NOT_LITERAL  # literal_eval also reads 1 + 2j; only plain literals are the source's own values
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return _NOT_LITERAL


def encode_value(value, budget=None, depth=0):
    """A built-in value as JSON-ready data (exact built-in types only: an object whose ``==`` always answers
    True is no value here); raises TypeError for anything else or past the size budget."""
    budget = budget if budget is not None else [_ENCODED_CHARS]
    kind = type(value)
    budget[0] -= 1 + (len(value) if kind in (str, bytes) else 0)
    if budget[0] < 0 or depth > 50:
        raise TypeError("too large to report")
    if value is None or kind is bool or kind is str:
        return value
    if kind is int:
        if value.bit_length() > 4_096:
            raise TypeError("too large to report")
        return value
    if kind is float:
        return {"float": repr(value)}
    if kind is complex:
        return {"complex": [repr(value.real), repr(value.imag)]}
    if kind is bytes:
        return {"bytes": value.hex()}
    if kind in (list, tuple, set, frozenset):
        return {kind.__name__: [encode_value(item, budget, depth + 1) for item in value]}
    if kind is dict:
        return {"dict": [[encode_value(key, budget, depth + 1), encode_value(item, budget, depth + 1)]
                         for key, item in value.items()]}
    raise TypeError(f"a {kind.__name__} is not a built-in value")


def _counts(statement):
    import ast

    test = getattr(statement, "test", None)
    return isinstance(statement, ast.Assert) and not isinstance(test, ast.Constant) and any(
        isinstance(node, ast.Call) for node in ast.walk(test))


def _count_passed_asserts(source, filename):
    """The program's syntax tree with, after each module-level ``assert`` that calls something, a call that
    records that it passed with the values of its operands (the progress of test-driven coding). Each operand
    the verdict depends on passes through a hook that notes its value and returns it unchanged, so the assert
    runs as written: the same evaluation order, short-circuits and side effects."""
    import ast

    tree = ast.parse(source, filename)
    plans = assert_plans(source)
    body = []
    for statement in tree.body:
        if _counts(statement):
            _observe_operands(statement, plans[statement.lineno])
        body.append(statement)
        if _counts(statement):
            hook = ast.Expr(ast.Call(ast.Name(ASSERT_HOOK, ast.Load()), [ast.Constant(statement.lineno)], []))
            body.append(ast.copy_location(hook, statement))
    tree.body = body
    return ast.fix_missing_locations(tree)


def _observe_operands(statement, plan):
    import ast

    def observed(node, index):
        if plan[2][index][0] == "literal":
            return node
        call = ast.Call(ast.Name(VALUE_HOOK, ast.Load()), [ast.Constant(statement.lineno), ast.Constant(index), node],
                        [])
        return ast.copy_location(call, node)

    test = statement.test
    if plan[0] == "compare":
        test.left = observed(test.left, 0)
        test.comparators = [observed(node, index) for index, node in enumerate(test.comparators, start=1)]
    elif plan[0] == "not":
        test.operand = observed(test.operand, 0)
    else:
        statement.test = observed(test, 0)


def _print_user_traceback(error):
    """The traceback as Python prints it, without this launcher's own frames."""
    import traceback

    tb = error.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    sys.stderr.write("".join(traceback.format_exception(type(error), error, tb)))


def main():
    config = json.loads(sys.argv[1])
    # the program finds its report pipe, and any channel the parent gave it, at fixed numbers
    moves = [(config["report_fd"], REPORT_FD)] + [(source, int(target)) for target, source in
                                                  config.get("channels", {}).items()]
    # duplicates above every target first, so that no move overwrites a descriptor still to be moved
    moved = {source: fcntl.fcntl(source, fcntl.F_DUPFD_CLOEXEC, 100) for source, target in moves if source != target}
    for source, target in moves:
        if source in moved:
            os.dup2(moved[source], target)
    for source, duplicate in moved.items():
        os.close(duplicate)
        if source not in {target for _, target in moves}:
            os.close(source)
    with open(config["main"], encoding="utf-8") as handle:
        source = handle.read()
    _apply_limits(config)
    faulthandler.enable()  # a C-level crash prints the Python stack before the process dies
    layers = _isolate(config)
    _report({"kind": "isolation", **layers})
    if config.get("strict") and not (layers["landlock"] and layers["seccomp"] and layers["private_view"]):
        _report({"kind": "refused"})
        sys.stderr.write(f"sandbox refused to run: isolation incomplete: {layers}\n")
        return STRICT_REFUSAL_EXIT_CODE

    module = types.ModuleType("__main__")
    module.__file__ = config["main"]
    module.__builtins__ = __builtins__
    passed_lines = set()
    values = {}

    def assert_value(line, index, value):
        try:
            values.setdefault(line, {})[index] = encode_value(value)
        except (TypeError, ValueError, RecursionError):
            values.setdefault(line, {}).pop(index, None)  # not a built-in value: the assert cannot count
        return value

    def assert_passed(line):
        if line not in passed_lines:
            passed_lines.add(line)
            observed = sorted(values.pop(line, {}).items())
            _report({"kind": "assert_passed", "line": line, "values": [[index, data] for index, data in observed]})

    setattr(module, ASSERT_HOOK, assert_passed)
    setattr(module, VALUE_HOOK, assert_value)
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
        try:
            _print_user_traceback(error)
        except MemoryError:  # the program left no room to import traceback: its last line, as Python ends one
            sys.stderr.write(f"{type(error).__name__}: {error}\n")
        _report({"kind": "exception", "type": type(error).__name__})
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
