"""What the agent reads of its jail to close a call: who is left, what the OOM killer did, what changed.

Apart from :mod:`sandbox._jailside.agent` because these only read the kernel's files and the
agent's own limits, with no state of the loop: whether a live process of the command uid is left
(the sweep repeats until none is), the memory cgroup's ``oom_kill`` count (compared with its
value when the call began), and a fingerprint of what commands inherit from the agent (a call
that changed it spoils the jail, which then retires).
"""

from __future__ import annotations

import contextlib
import os
import resource

OOM_FILES = ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control")
RLIMITS = tuple(getattr(resource, name) for name in sorted(dir(resource)) if name.startswith("RLIMIT_"))


def inherited() -> tuple[object, ...]:
    """What commands inherit from the agent that a process of its uid may change on it anyway.

    prlimit(2), setpriority(2) and sched_setaffinity(2) ask only for a matching uid, not for
    ptrace access, so being non-dumpable does not protect these.
    """
    limits = tuple(resource.getrlimit(r) for r in RLIMITS)
    return limits, os.getpriority(os.PRIO_PROCESS, 0), sorted(os.sched_getaffinity(0))


def oom_kills() -> int:
    """The container's memory cgroup oom_kill count (v2 or v1 file, whichever is shown)."""
    for path in OOM_FILES:
        with contextlib.suppress(OSError), open(path, encoding="ascii") as fh:
            for line in fh:
                name, _, value = line.partition(" ")
                if name == "oom_kill":
                    return int(value)
    return 0


def others(me: int, uid: int) -> bool:
    """Whether a live (not zombie) process of ``uid`` other than ``me`` is in the container."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        with contextlib.suppress(OSError), open(f"/proc/{entry}/stat", "rb") as fh:
            state = fh.read().rpartition(b")")[2].split()[0]
            if state in (b"Z", b"X"):
                continue
            if owner(entry) == uid:
                return True
    return False


def owner(pid: str) -> int:
    with open(f"/proc/{pid}/status", "rb") as fh:
        for line in fh:
            if line.startswith(b"Uid:"):
                return int(line.split()[1])
    return -1
