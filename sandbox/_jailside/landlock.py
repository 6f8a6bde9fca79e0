"""The Landlock jail's launcher: confine this process, then become the command.

Started as ``python3 -I -S -c <this> STATUS_FD SECCOMP MODE PATH ...`` by the host
(:mod:`sandbox.backends.landlock`) ahead of the call it will serve (a spare: the interpreter's
start, reading the seccomp program and the rules every call shares are off the call's path), it
waits on stdin for its request, which the host writes once it has put it in the call's cgroups
and set its rlimits: ``go LENGTH`` and a line's end, then LENGTH bytes of NUL-separated fields (a path, a
variable, an argument hold any byte but NUL): the working directory, the number of environment
variables and each ``NAME=value``, the seccomp program's file (or empty), the ports ``connect``
may reach (comma-separated), the number of path rules and each rule's mode and path, ``--``, and
the command's arguments. What follows on stdin is the command's. Then, in this order, each step
failing closed:

1. ``PR_SET_NO_NEW_PRIVS``; as root, the capabilities dropped for good (securebits locked so that
   ``execve`` gives none back, the bounding and ambient sets emptied, ``capset`` to nothing);
2. a Landlock ruleset: every filesystem right this kernel knows is handled, and only the spec's
   paths get any; TCP ``bind`` and ``connect`` are handled (ABI 4), ``connect`` allowed to the
   spec's ports only (the egress proxy's); abstract unix sockets and signals scoped to the jail
   (ABI 6); denials of the command audited when the kernel can (ABI 7, ``LOG_NEW_EXEC_ON``);
3. the seccomp program read from the spec's file (the host builds it: :mod:`sandbox.backends.seccomp`);
4. the command, as our child: we stay, a subreaper, so every orphan of the call comes to us;
   when the command ends we kill what is left (``kill(-1)`` reaches this jail only: Landlock
   scopes signals) and end as it did (its exit code, or its signal).

Until step 4, a failure is written to ``STATUS_FD`` and the launcher exits 125 without running
anything; the host reads that descriptor to its end (closed on ``execve``) and refuses the call.
A command that cannot be executed after that is the command's own failure: 127, as a shell says.
TERM, INT and HUP are the command's to answer: the launcher ignores them (a handler, which
``execve`` resets), and only KILL ends it early, by the host, which kills the rest the same way.

Standard library only (``ctypes``): this runs before anything of the user's, under ``-I -S``,
and imports nothing it can do without (no ``json``, ``contextlib`` or ``typing``).
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import stat
import sys
import warnings  # noqa: F401 - os.execvpe imports it to search PATH: in the forked child, each call, from disk

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

MIN_ABI = 6  # TCP rules (4) and signals scoped to the jail (6): without them kill(-1) would reach the user's all
SYS_CREATE_RULESET, SYS_ADD_RULE, SYS_RESTRICT_SELF = 444, 445, 446  # the same on x86-64 and aarch64
SYS_CAPSET = {"x86_64": 126, "aarch64": 91}
PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, PR_CAPBSET_DROP, PR_SET_SECUREBITS, PR_CAP_AMBIENT = 38, 22, 24, 28, 47
PR_SET_CHILD_SUBREAPER = 36
SECCOMP_MODE_FILTER, PR_CAP_AMBIENT_CLEAR_ALL = 2, 4
SECUREBITS_LOCKED_NOROOT = 0x2F  # NOROOT, NO_SETUID_FIXUP and KEEP_CAPS_LOCKED, each with its lock

# Filesystem rights (Linux uapi/linux/landlock.h), by the ABI that brought them.
EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
REMOVE_DIR, REMOVE_FILE, MAKE_CHAR, MAKE_DIR = 1 << 4, 1 << 5, 1 << 6, 1 << 7
MAKE_REG, MAKE_SOCK, MAKE_FIFO, MAKE_BLOCK, MAKE_SYM = 1 << 8, 1 << 9, 1 << 10, 1 << 11, 1 << 12
REFER, TRUNCATE, IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 5: (1 << 16) - 1}
FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV  # all a rule on a non-directory may hold
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX, SCOPE_SIGNAL = 1 << 0, 1 << 1
RULE_PATH_BENEATH, RULE_NET_PORT = 1, 2
LOG_SAME_EXEC_OFF = 1 << 0  # ABI 7: never audit the launcher itself (its sweep signals every process)
LOG_NEW_EXEC_ON = 1 << 1  # ABI 7: audit what the command (a new executable) is denied

READ = EXECUTE | READ_FILE | READ_DIR
WRITE = WRITE_FILE | TRUNCATE | REMOVE_DIR | REMOVE_FILE | MAKE_DIR | MAKE_REG | MAKE_SYM | MAKE_FIFO | REFER
MODES = {"ro": READ, "rw": READ | WRITE, "list": READ_DIR, "dev": READ_FILE | WRITE_FILE | IOCTL_DEV}

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class Refused(Exception):
    """The jail could not be set up as the spec says: nothing runs."""


class RulesetAttr(ctypes.Structure):
    _fields_ = (("fs", ctypes.c_uint64), ("net", ctypes.c_uint64), ("scoped", ctypes.c_uint64))


class PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = (("allowed", ctypes.c_uint64), ("parent_fd", ctypes.c_int32))


class NetPort(ctypes.Structure):
    _fields_ = (("allowed", ctypes.c_uint64), ("port", ctypes.c_uint64))


class SockFprog(ctypes.Structure):
    _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.c_void_p))


def _call(what: str, result: int) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise Refused(f"{what}: {os.strerror(err)} (errno {err})")
    return result


def abi() -> int:
    """Landlock's ABI version here; 0 when the kernel has none (or it is disabled at boot)."""
    version = _libc.syscall(SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    return max(int(version), 0)


def fs_rights(version: int) -> int:
    return FS_BY_ABI[max(v for v in FS_BY_ABI if v <= version)]


def drop_privileges() -> None:
    """No new privileges; as root, no capabilities now or after ``execve``."""
    _call("PR_SET_NO_NEW_PRIVS", _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))
    if os.geteuid() != 0:
        return
    _call("PR_SET_SECUREBITS", _libc.prctl(PR_SET_SECUREBITS, SECUREBITS_LOCKED_NOROOT, 0, 0, 0))
    with open("/proc/sys/kernel/cap_last_cap") as last:
        for cap in range(int(last.read()) + 1):
            _call(f"PR_CAPBSET_DROP {cap}", _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0))
    _call("PR_CAP_AMBIENT clear", _libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0))
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable twice over: all empty
    number = SYS_CAPSET.get(os.uname().machine)
    if number is None:
        raise Refused(f"no capset number known for {os.uname().machine}")
    _call("capset", _libc.syscall(number, header, data))


class Ruleset:
    """One call's ruleset: created, and given the rules every call shares, while the launcher
    waits for its request; then the call's own rules and ports, then enforced on this process."""

    def __init__(self) -> None:
        self.version = abi()
        if self.version < MIN_ABI:  # the host checks it too; this is the last word
            raise Refused(f"Landlock ABI {self.version} here; the jail needs {MIN_ABI} (TCP rules, scoped signals)")
        self.handled = fs_rights(self.version)
        attr = RulesetAttr(
            fs=self.handled, net=NET_BIND_TCP | NET_CONNECT_TCP, scoped=SCOPE_ABSTRACT_UNIX | SCOPE_SIGNAL
        )
        self.fd = _call(
            "landlock_create_ruleset", _libc.syscall(SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.sizeof(attr), 0)
        )

    def allow(self, paths: list[tuple[str, str]]) -> None:
        for path, mode in paths:
            _add_path(self.fd, path, MODES[mode] & self.handled)

    def enforce(self, ports: list[int]) -> None:
        try:
            for port in ports:
                rule = NetPort(allowed=NET_CONNECT_TCP, port=int(port))
                _call(f"allow port {port}", _libc.syscall(SYS_ADD_RULE, self.fd, RULE_NET_PORT, ctypes.byref(rule), 0))
            flags = LOG_SAME_EXEC_OFF | LOG_NEW_EXEC_ON if self.version >= 7 else 0
            _call("landlock_restrict_self", _libc.syscall(SYS_RESTRICT_SELF, self.fd, flags))
        finally:
            os.close(self.fd)


def _add_path(ruleset: int, path: str, rights: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)  # a path swapped for a link grants nothing
    except FileNotFoundError:
        return  # /lib32 on a host without it: nothing to allow
    except OSError as exc:
        raise Refused(f"cannot open {path}: {exc.strerror}") from exc
    try:
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            rights &= FILE_RIGHTS
        rule = PathBeneath(allowed=rights, parent_fd=fd)
        _call(f"allow {path}", _libc.syscall(SYS_ADD_RULE, ruleset, RULE_PATH_BENEATH, ctypes.byref(rule), 0))
    finally:
        os.close(fd)


def read_seccomp(path: str) -> bytes:
    """The program's bytes, read before the jail closes the data directory to us."""
    with open(path, "rb") as program:
        return program.read()


def load_seccomp(code: bytes, path: str) -> None:
    if not code or len(code) % 8:
        raise Refused(f"the seccomp program {path} is malformed")
    buffer = ctypes.create_string_buffer(code, len(code))
    prog = SockFprog(len=len(code) // 8, filter=ctypes.cast(buffer, ctypes.c_void_p))
    _call("seccomp", _libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0))


def _request() -> list[str]:
    """Wait for the host's request (its header read byte by byte, then exactly its length: what
    follows is the command's stdin) and split it into its fields."""
    header = b""
    while not header.endswith(b"\n"):
        byte = os.read(0, 1)
        if not byte:
            raise Refused("the host went away before the call was released")
        header += byte
        if len(header) > 32:
            raise Refused("the host's request has no header")
    word, _, length = header.decode().partition(" ")
    if word != "go" or not length.strip().isdigit():
        raise Refused("the host's request has no header")
    size, data = int(length), b""
    while len(data) < size:
        chunk = os.read(0, size - len(data))
        if not chunk:
            raise Refused("the host's request ended early")
        data += chunk
    return [os.fsdecode(field) for field in data.split(b"\0")]


def _children() -> list[int]:
    pids: list[int] = []
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/children") as listed:
            pids += [int(pid) for pid in listed.read().split()]
    return pids


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        return  # gone already


def sweep() -> None:
    """Kill what is left of the jail: ``kill(-1)`` reaches only this jail's processes (Landlock
    scopes signals to it), and each orphan comes to us (a subreaper) to be reaped, until none is left."""
    while True:
        _kill(-1)
        for pid in _children():
            _kill(pid)
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def supervise(command: list[str], env: dict[str, str], status: int) -> int:
    """Run ``command`` as our child and wait for it; return its wait status once the jail is empty."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: None)  # the command's to answer; reset for it by execve
    pid = os.fork()
    if pid == 0:
        os.set_inheritable(status, False)  # closed by execve: the host sees its end and knows we ran
        try:
            os.execvpe(command[0], command, env)
        except OSError as exc:
            os.write(2, f"sandbox: cannot run {command[0]}: {exc.strerror}\n".encode())
            os._exit(126 if isinstance(exc, PermissionError) else 127)
    os.close(status)
    for fd in (0, 1, 2):  # the streams are the command's: ours must not hold them open
        os.close(fd)
    while True:
        try:
            reaped, wait_status = os.waitpid(-1, 0)
        except InterruptedError:
            continue
        if reaped == pid:
            break
    sweep()
    return wait_status


def pairs(fields: list[str]) -> list[tuple[str, str]]:
    """``MODE PATH MODE PATH ...`` as ``(path, mode)`` rules."""
    if len(fields) % 2:
        raise ValueError("a rule without its path")
    return [(path, mode) for mode, path in zip(fields[::2], fields[1::2], strict=True)]


def parse(fields: list[str]) -> tuple[str, dict[str, str], dict[str, Any], list[str]]:
    """A request's fields (the module doc): the working directory, the environment, the spec and the command."""
    cwd, variables = fields[0], int(fields[1])
    env = dict(entry.partition("=")[::2] for entry in fields[2 : 2 + variables])
    at = 2 + variables
    seccomp, ports, count = fields[at], fields[at + 1], int(fields[at + 2])
    rules = fields[at + 3 : at + 3 + 2 * count]
    rest = fields[at + 3 + 2 * count :]
    if len(rules) != 2 * count or len(rest) < 2 or rest[0] != "--":
        raise ValueError("the host's request is malformed")
    spec = {"seccomp": seccomp, "connect": [int(port) for port in ports.split(",") if port], "paths": pairs(rules)}
    return cwd, env, spec, rest[1:]


FAILURES = (Refused, OSError, ValueError, KeyError, IndexError)


def main(argv: list[str]) -> None:
    """``STATUS_FD SECCOMP MODE PATH ...``: the seccomp program's file and the rules every call
    shares, read and built while waiting; then the request (the module doc)."""
    status, seccomp = int(argv[1]), argv[2]
    ahead: tuple[bytes, Ruleset] | BaseException
    try:
        ahead = (read_seccomp(seccomp) if seccomp else b""), Ruleset()
        ahead[1].allow(pairs(argv[3:]))
    except FAILURES as exc:
        ahead = exc  # told once the call comes: a launcher never ends before it is asked
    try:
        cwd, env, spec, command = parse(_request())
        if isinstance(ahead, BaseException):
            raise ahead
        program, ruleset = ahead
        if spec["seccomp"] != seccomp:  # the host's program changed since this launcher started
            program = read_seccomp(spec["seccomp"]) if spec["seccomp"] else b""
        os.chdir(cwd)
        _call("PR_SET_CHILD_SUBREAPER", _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0))
        drop_privileges()
        ruleset.allow(spec["paths"])
        ruleset.enforce(spec["connect"])
        if spec["seccomp"]:
            load_seccomp(program, spec["seccomp"])
    except FAILURES as exc:
        os.write(status, f"{exc}".encode())
        os._exit(125)
    wait_status = supervise(command, env, status)
    if os.WIFSIGNALED(wait_status):  # die as the command did, so the host sees the same end
        sig = os.WTERMSIG(wait_status)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if sig not in (signal.SIGKILL, signal.SIGSTOP):  # their action is fixed already
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
        os.kill(os.getpid(), sig)
    os._exit(os.waitstatus_to_exitcode(wait_status) if os.WIFEXITED(wait_status) else 1)


if __name__ == "__main__":
    main(sys.argv)
