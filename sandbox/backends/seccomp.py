"""The bubblewrap jail's seccomp filter: what a sandboxed command has no business calling.

Built with libseccomp through PyPI's ``pyseccomp`` (a ctypes binding with the API of
libseccomp's own Python module), so it needs only ``libseccomp.so.2``, which every systemd host
has, and works in any venv; Debian's ``python3-seccomp`` serves only the system interpreter.

The filter allows by default and refuses, with ``EPERM`` so that programs degrade rather than
crash, what Docker's default profile refuses to an unprivileged container plus a few more:

- mounts, namespaces and root changes (``mount``, ``unshare``, ``setns``, the new mount API,
  ``clone`` with any ``CLONE_NEW*`` flag; ``clone3``, whose flags a filter cannot read, answers
  ``ENOSYS`` so that libc falls back to ``clone``, as Docker does);
- the kernel's keyrings, ``bpf``, ``perf_event_open``, ``userfaultfd``, ``io_uring``,
  ``open_by_handle_at``, ``kexec_*``, module loading, ``acct``, ``swapon``, setting the clock, ``reboot``;
- attaching to a process the command did not start (``ptrace`` ``PTRACE_ATTACH`` and
  ``PTRACE_SEIZE``, ``process_vm_*``, ``pidfd_getfd``): ``PTRACE_TRACEME``, how ``strace cmd``
  and debuggers start a program, stays;
- the ``TIOCSTI`` and ``TIOCLINUX`` ioctls (typing into, or reading, the terminal outside);
- sockets of any family but ``AF_UNIX``, ``AF_INET``, ``AF_INET6`` and ``AF_NETLINK``
  (vsock, packet, Bluetooth, ``AF_ALG``, ...).

The Landlock jail (:mod:`~sandbox.backends.landlock`), which has no network namespace, gets
the ``landlock`` variant: ``socket`` of ``AF_INET`` and ``AF_INET6`` streams only (Landlock
decides whom TCP may reach; UDP, raw and every other family would go around it), no ``AF_UNIX``
socket at all (connecting to a path like ``/var/run/docker.sock`` is beyond this kernel's
Landlock), ``socketpair`` of ``AF_UNIX`` only, and no ``MSG_FASTOPEN`` send (a TCP connect
that skips the ``connect`` hook Landlock watches).

It is built for the host's own architecture (x86-64 or aarch64; both are tested to build), and
every other ABI is closed: a 32-bit ``int 0x80`` call or an x32 call gets ``EPERM`` whatever it
asks. bwrap loads it (``--seccomp FD``) just before it runs the command, after its own set-up.

Generating it costs a fifth of a second (the binding looks for the library with ``ldconfig``):
the BPF program is kept in the data directory's cache, keyed by the rule tables and the host,
and ``sandbox run``'s quick path only ever reads that file.
"""

from __future__ import annotations

import contextlib
import errno
import os
import zlib
from functools import cache
from typing import TYPE_CHECKING, Any, Literal

from sandbox import datadir

if TYPE_CHECKING:
    from pathlib import Path

DENIED = (
    # mounts, namespaces, root changes
    "mount",
    "umount",
    "umount2",
    "pivot_root",
    "chroot",
    "unshare",
    "setns",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "move_mount",
    "open_tree",
    "mount_setattr",
    # kernel facilities a command never needs
    "add_key",
    "request_key",
    "keyctl",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "open_by_handle_at",
    "name_to_handle_at",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "create_module",
    "get_kernel_syms",
    "query_module",
    "acct",
    "swapon",
    "swapoff",
    "reboot",
    "settimeofday",
    "clock_settime",
    "syslog",
    "quotactl",
    "quotactl_fd",
    "lookup_dcookie",
    "nfsservctl",
    "uselib",
    "ustat",
    "sysfs",
    "_sysctl",
    "iopl",
    "ioperm",
    "vm86",
    "vm86old",
    # other processes
    "process_vm_readv",
    "process_vm_writev",
    "pidfd_getfd",
    "kcmp",
)
"""Refused outright with ``EPERM``."""

ENOSYS_CALLS = ("clone3",)
"""Answered ``ENOSYS``: libc then uses the call a filter can read."""

CLONE_NAMESPACE_FLAGS = (
    0x00000080,  # CLONE_NEWTIME
    0x00020000,  # CLONE_NEWNS
    0x02000000,  # CLONE_NEWCGROUP
    0x04000000,  # CLONE_NEWUTS
    0x08000000,  # CLONE_NEWIPC
    0x10000000,  # CLONE_NEWUSER
    0x20000000,  # CLONE_NEWPID
    0x40000000,  # CLONE_NEWNET
)
PTRACE_REFUSED = (16, 0x4206)  # PTRACE_ATTACH, PTRACE_SEIZE
IOCTLS_REFUSED = (0x5412, 0x541C)  # TIOCSTI, TIOCLINUX
SOCKET_FAMILIES = (1, 2, 10, 16)  # AF_UNIX, AF_INET, AF_INET6, AF_NETLINK: the only ones allowed
ARCHES = ("x86_64", "aarch64")
"""The machines a filter is built for (``os.uname().machine``); elsewhere the guarantee is absent."""

Variant = Literal["bwrap", "landlock"]
LANDLOCK_SOCKETS = (2, 10)  # AF_INET, AF_INET6: streams only, their peers decided by Landlock
LANDLOCK_SOCKETPAIRS = (1,)  # AF_UNIX: a pair joins nothing outside
INET_TYPES_REFUSED = (2, 3, 4, 5, 6, 10)  # DGRAM, RAW, RDM, SEQPACKET, DCCP, PACKET (low bits of the type)
MSG_FASTOPEN = 0x20000000
SENDS_FLAGS_ARG = (("sendto", 3), ("sendmsg", 2), ("sendmmsg", 3))
_KEY_PARTS = (DENIED, ENOSYS_CALLS, CLONE_NAMESPACE_FLAGS, PTRACE_REFUSED, IOCTLS_REFUSED, SOCKET_FAMILIES, 2)
_LANDLOCK_PARTS = (LANDLOCK_SOCKETS, LANDLOCK_SOCKETPAIRS, INET_TYPES_REFUSED, MSG_FASTOPEN, SENDS_FLAGS_ARG)
_BPF_INSN = 8  # bytes in one classic BPF instruction


class Unavailable(Exception):
    """No filter can be built here; the message says why (no libseccomp, another machine)."""


def build(machine: str | None = None, variant: Variant = "bwrap") -> bytes:
    """The BPF program for ``machine`` (default: this host's), as bwrap's ``--seccomp`` reads it."""
    machine = machine or os.uname().machine
    if machine not in ARCHES:
        raise Unavailable(f"no seccomp filter is built for {machine} (only {', '.join(ARCHES)})")
    try:
        import pyseccomp as sc  # type: ignore[import-untyped]
    except (ImportError, OSError, RuntimeError) as exc:  # the binding raises when libseccomp.so.2 is missing
        raise Unavailable(f"libseccomp is not usable here ({exc}); apt-get install libseccomp2") from exc
    arch = sc.Arch.X86_64 if machine == "x86_64" else sc.Arch.AARCH64
    refuse = sc.ERRNO(errno.EPERM)
    f = sc.SyscallFilter(sc.ALLOW)
    if arch != sc.system_arch():
        f.add_arch(arch)
        f.remove_arch(sc.Arch.NATIVE)
    f.set_attr(sc.Attr.ACT_BADARCH, refuse)  # 32-bit and x32 calls: every one refused
    for name in DENIED:
        _rule(sc, f, arch, refuse, name)
    for name in ENOSYS_CALLS:
        _rule(sc, f, arch, sc.ERRNO(errno.ENOSYS), name)
    for flag in CLONE_NAMESPACE_FLAGS:
        f.add_rule(refuse, "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    for request in PTRACE_REFUSED:
        f.add_rule(refuse, "ptrace", sc.Arg(0, sc.EQ, request))
    for request in IOCTLS_REFUSED:
        f.add_rule(refuse, "ioctl", sc.Arg(1, sc.MASKED_EQ, 0xFFFFFFFF, request))
    if variant == "landlock":
        _landlock_sockets(sc, f, refuse)
    else:
        for call in ("socket", "socketpair"):
            _families(sc, f, refuse, call, SOCKET_FAMILIES)
    r, w = os.pipe()
    try:
        with os.fdopen(w, "wb") as out:
            f.export_bpf(out)
        return _read_all(r)
    finally:
        os.close(r)


def _rule(sc: Any, f: Any, arch: int, action: int, name: str) -> None:
    if sc.resolve_syscall(arch, name) < 0:  # not a call of this architecture (vm86 on aarch64 ...)
        return
    f.add_rule(action, name)


def _families(sc: Any, f: Any, refuse: int, call: str, allowed: tuple[int, ...]) -> None:
    """Refuse ``call`` for every address family but ``allowed``."""
    for family in range(max(allowed)):
        if family not in allowed:
            f.add_rule(refuse, call, sc.Arg(0, sc.EQ, family))
    f.add_rule(refuse, call, sc.Arg(0, sc.GT, max(allowed)))


def _landlock_sockets(sc: Any, f: Any, refuse: int) -> None:
    """The Landlock jail's sockets: TCP (which Landlock confines) and local pairs, nothing else."""
    _families(sc, f, refuse, "socket", LANDLOCK_SOCKETS)
    _families(sc, f, refuse, "socketpair", LANDLOCK_SOCKETPAIRS)
    for family in LANDLOCK_SOCKETS:
        for kind in INET_TYPES_REFUSED:
            f.add_rule(refuse, "socket", sc.Arg(0, sc.EQ, family), sc.Arg(1, sc.MASKED_EQ, 0xF, kind))
    for call, arg in SENDS_FLAGS_ARG:
        f.add_rule(refuse, call, sc.Arg(arg, sc.MASKED_EQ, MSG_FASTOPEN, MSG_FASTOPEN))


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    return b"".join(chunks)


def cache_key(variant: Variant = "bwrap") -> str:
    from sandbox import __version__

    # A cache key, not a seal (the data directory is the user's own): crc32, as zlib is loaded
    # already where hashlib would cost ``sandbox run``'s quick path 4 ms.
    parts = _KEY_PARTS if variant == "bwrap" else (_KEY_PARTS, variant, _LANDLOCK_PARTS)
    text = repr((__version__, os.uname().machine, parts))
    return f"{zlib.crc32(text.encode()):08x}"


def cached_path(variant: Variant = "bwrap") -> Path:
    return datadir.data_dir() / "cache" / f"seccomp-{cache_key(variant)}.bpf"


def kept_filter(variant: Variant = "bwrap") -> str | None:
    """The cached program's path when it is there and well formed, else ``None`` (no generation)."""
    with contextlib.suppress(OSError):
        path = cached_path(variant)
        size = path.stat().st_size
        if size and size % _BPF_INSN == 0:
            return str(path)
    return None


@cache
def filter_path(variant: Variant = "bwrap") -> str:
    """The program's file, built and kept on first use. Raises :class:`Unavailable`."""
    kept = kept_filter(variant)
    if kept is not None:
        return kept
    program = build(variant=variant)
    path = cached_path(variant)
    datadir.subdir(path.parent.name)  # the cache directory: 0700 whatever the umask
    temp = path.with_name(f".{path.name}.{os.getpid()}")
    temp.write_bytes(program)
    temp.replace(path)
    return str(path)


def availability(variant: Variant = "bwrap") -> str | None:
    """``None`` when the ``variant``'s jails get their filter here, else why not."""
    try:
        filter_path(variant)
    except Unavailable as exc:
        return str(exc)
    except OSError as exc:
        return f"the seccomp filter cannot be kept in the data directory: {exc}"
    return None


def open_filter() -> int:
    """A read-only descriptor of the program, for ``bwrap --seccomp``; the caller closes it."""
    try:
        return os.open(filter_path(), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:  # the cache was cleared under a running process: build it again
        filter_path.cache_clear()
        return os.open(filter_path(), os.O_RDONLY | os.O_CLOEXEC)


def encoded() -> str | None:
    """The program in base64, for an agent that loads it itself (Docker); ``None`` when unavailable."""
    if availability() is not None:
        return None
    import base64

    with open(filter_path(), "rb") as program:
        return base64.b64encode(program.read()).decode()
