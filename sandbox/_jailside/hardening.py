"""What the agent does to itself before anything else runs: non-dumpable, then the seccomp filter.

Apart from :mod:`sandbox._jailside.agent` because it is the agent's armour, not its work: two
``prctl(2)`` calls through ``ctypes``, made once at start and failing closed (the agent exits
with a status of its own, and the executor reports the jail as unusable), never again after.
"""

from __future__ import annotations

import base64
import ctypes
import sys

PR_SET_DUMPABLE = 4
PR_SET_SECCOMP, SECCOMP_MODE_FILTER, PR_SET_NO_NEW_PRIVS = 22, 2, 38


class _Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]  # struct sock_fprog


def confine_syscalls(encoded: str) -> None:
    """The executor's seccomp filter (base64 BPF), stacked on the engine's own profile before
    anything else runs: it binds this agent and every command it starts. Fails closed."""
    program = base64.b64decode(encoded)
    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = _Fprog(len(program) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    libc = ctypes.CDLL(None, use_errno=True)
    for what, args in (
        ("PR_SET_NO_NEW_PRIVS", (PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)),
        ("PR_SET_SECCOMP", (PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0)),
    ):
        if libc.prctl(*args) != 0:
            sys.stderr.write(f"sandbox agent: prctl({what}) failed: errno {ctypes.get_errno()}\n")
            sys.exit(71)


def nondumpable() -> None:
    """No ptrace of the agent, no ``/proc/1/{mem,fd,environ}``, by processes of its own uid."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        sys.stderr.write(f"sandbox agent: prctl(PR_SET_DUMPABLE) failed: errno {ctypes.get_errno()}\n")
        sys.exit(70)
