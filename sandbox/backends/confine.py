"""Confining a local call's first process, with no event loop: cgroups, rlimits, signals.

The limits' mechanisms are described in :mod:`sandbox.backends.local`; this module holds the
synchronous part, which the event-loop backends and the synchronous ``sandbox run``
(:mod:`sandbox.launch`) share. ``profile`` is anything shaped like :class:`sandbox.profile.Profile`.
"""

from __future__ import annotations

import contextlib
import os
import resource
import select
import signal
import time
from typing import TYPE_CHECKING, Literal

from sandbox import owners
from sandbox.backends import bwrap_argv, cgroups
from sandbox.errors import BackendUnavailable, map_errors
from sandbox.guarantees import LIMITS, Enforcement

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    from sandbox.profile import Profile

Kind = Literal["bwrap", "host", "landlock"]
KILL_WAIT_S = 10.0


def call_cgroup(profile: Profile) -> cgroups.CallCgroup | None:
    """Cgroups for the profile's memory/pids/cpu limits, on the controllers this host has."""
    lim = profile.limits
    wanted = {"memory": (lim.memory, "memory"), "pids": (lim.pids, "pids"), "cpus": (lim.cpus, "cpu")}
    usable = {
        key: value
        for key, (value, controller) in wanted.items()
        if value is not None and isinstance(cgroups.hierarchies()[controller], cgroups.Hierarchy)
    }
    # Tree tracking wants a cgroup even when no limit is set; pids.max "max" costs nothing.
    if not usable and isinstance(cgroups.hierarchies()["pids"], cgroups.Hierarchy):
        usable = {"pids": 2**22}
    if not usable:
        return None
    limits = cgroups.Limits(memory=_int(usable.get("memory")), pids=_int(usable.get("pids")), cpus=usable.get("cpus"))
    with map_errors("cannot create the call's cgroup", BackendUnavailable):
        return cgroups.CallCgroup.create(limits, owners.owner_tag())


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)


_PER_PROCESS = {"cpu_time_s": "rlimit CPU", "file_size": "rlimit FSIZE", "nofile": "rlimit NOFILE"}


def enforcement(kind: Kind) -> dict[str, Enforcement]:
    """Limit -> how the ``kind`` backend enforces it on this host (``how=None``: it cannot)."""
    found = {name: Enforcement(how, "process") for name, how in _PER_PROCESS.items()}
    where = cgroups.hierarchies()
    memory, pids, cpu = where["memory"], where["pids"], where["cpu"]
    found["memory"] = (
        Enforcement(memory.mechanism, "call")
        if isinstance(memory, cgroups.Hierarchy)
        else Enforcement("rlimit DATA", "process")
    )
    found["cpus"] = (
        Enforcement(cpu.mechanism, "call")
        if isinstance(cpu, cgroups.Hierarchy)
        else Enforcement(None, why_not=f"needs a cpu cgroup: {cpu}")
    )
    if isinstance(pids, cgroups.Hierarchy):
        found["pids"] = Enforcement(pids.mechanism, "call")
    elif kind == "bwrap" and os.geteuid() != 0:
        found["pids"] = Enforcement("rlimit NPROC in the call's own user namespace", "call")
    elif kind == "bwrap":
        found["pids"] = Enforcement(None, why_not=f"the kernel does not enforce RLIMIT_NPROC for root and {pids}")
    elif kind == "landlock" and os.geteuid() != 0:
        # No user namespace of its own: the kernel counts every task of this user, so the call gets
        # what this user runs when it starts plus its limit (a fork bomb stops there; so, for
        # that moment, do the user's other new processes).
        found["pids"] = Enforcement(USER_NPROC, "call")
    elif kind == "landlock":
        found["pids"] = Enforcement(None, why_not=f"the kernel does not enforce RLIMIT_NPROC for root and {pids}")
    else:
        found["pids"] = Enforcement(
            None,
            why_not="RLIMIT_NPROC would count every process of this user "
            f"on the host, not the call's; needs a pids cgroup: {pids}",
        )
    found["tmp_size"] = (
        Enforcement(_tmpfs_mechanism(), "call")
        if kind == "bwrap"
        else Enforcement(None, why_not=f"the {kind} backend has no tmpfs /tmp")
    )
    return {name: found[name] for name in LIMITS}


USER_NPROC = "rlimit NPROC over this user's tasks: those at the call's start plus the limit"


def user_tasks() -> int:
    """How many tasks (threads: what RLIMIT_NPROC counts) this user runs now."""
    uid = str(os.geteuid())
    count = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError), open(f"/proc/{entry.name}/status", "rb") as status:
            fields = dict(line.split(b":", 1) for line in status.read().splitlines() if b":" in line)
            if fields.get(b"Uid", b"").split()[:1] == [uid.encode()]:
                count += int(fields.get(b"Threads", b"1").strip() or 1)
    return count


def _tmpfs_mechanism() -> str:
    if bwrap_argv.inode_cap_available():
        return f"tmpfs size, and an inode per {bwrap_argv.BYTES_PER_TMP_INODE} bytes of it"
    return "tmpfs size (inodes: the kernel's default; unshare(1) or mount(1) is missing)"


def rlimits(profile: Profile, kind: Kind) -> list[tuple[int, int]]:
    """The rlimits a call's first process gets: the per-process ones and the cgroup fallbacks."""
    lim = profile.limits
    how = enforcement(kind)
    pairs: list[tuple[int, int | float | None]] = [
        (resource.RLIMIT_CPU, lim.cpu_time_s),
        (resource.RLIMIT_FSIZE, lim.file_size),
        (resource.RLIMIT_NOFILE, lim.nofile),
    ]
    if how["memory"].how == "rlimit DATA":
        pairs.append((resource.RLIMIT_DATA, lim.memory))
    if how["pids"].how == USER_NPROC and lim.pids is not None:
        pairs.append((resource.RLIMIT_NPROC, user_tasks() + lim.pids))
    elif (how["pids"].how or "").startswith("rlimit NPROC"):
        pairs.append((resource.RLIMIT_NPROC, lim.pids))
    return [(res, int(value)) for res, value in pairs if value is not None]


def confine(pid: int, profile: Profile, group: cgroups.CallCgroup | None, kind: Kind) -> None:
    """Put a held (not yet running the command) process in its cgroups and set its rlimits."""
    with map_errors("cannot confine the call's first process", BackendUnavailable):
        if group is not None:
            group.add(pid)
        for res, value in rlimits(profile, kind):
            # We may lower a limit we inherited, never raise it: a stricter one stays.
            _soft, hard = resource.prlimit(pid, res)
            capped = value if hard == resource.RLIM_INFINITY else min(value, hard)
            resource.prlimit(pid, res, (capped, capped))


@contextlib.contextmanager
def starting(what: str) -> Iterator[None]:
    """``map_errors`` for starting a call's process, with EAGAIN (no process left) in its own words."""
    with map_errors(what, BackendUnavailable):
        try:
            yield
        except BlockingIOError as exc:
            raise BackendUnavailable(
                f"{what}: the kernel refused a new process (EAGAIN): this user or the host has reached its "
                "process limit; a fork bomb may be running",
                errno="EAGAIN",
            ) from exc


def open_pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except OSError:  # gone already, or a kernel without pidfds
        return None


def alive(pid: int) -> bool:
    """Whether ``pid`` runs and is not a zombie (read from /proc: no psutil on the start-up path)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            state = fh.read().rpartition(b")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


def signal_all(pids: Sequence[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def removal_steps(group: cgroups.CallCgroup, wait: float = KILL_WAIT_S) -> Iterator[float]:
    """Remove a call's cgroups, killing what is still inside, as pauses for the caller to sleep.

    A member that has exited keeps its cgroup busy (EBUSY) until its last context switch, a
    moment after its parent reaped it; so removal is retried rather than given up at once
    (the cause of one call in 25 leaving an empty cgroup behind). What still stays after
    ``wait`` (``group.paths`` not empty) carries our name and is removed by ``sandbox gc``
    once we are gone. The caller sleeps each pause: ``time.sleep``, or ``anyio.sleep`` on a loop.
    """
    deadline = time.monotonic() + wait
    while not group.try_remove():
        if time.monotonic() > deadline:
            return
        group.kill()
        yield 0.002


class Tree:
    """A local call's processes: its first process, watched by pidfd, and its cgroup.

    Known two ways: as descendants of the first process (for bwrap, the pid namespace's init,
    which adopts every orphan of the namespace: ``kernel_reaps``) and as members of the call's
    cgroups (which nothing inside can leave). The kill signals the union of both.
    """

    def __init__(self, root_pid: int, cgroup: cgroups.CallCgroup | None, *, kernel_reaps: bool) -> None:
        """``root_pid`` must not have been reaped yet (it is held, or our unreaped child)."""
        self.root_pid = root_pid
        # bwrap's init is not our child: once it exits, whoever reaps it frees its pid for reuse,
        # so it is watched and signalled through a pidfd, never by number.
        self._root_fd = open_pidfd(root_pid)
        self.cgroup = cgroup
        self.kernel_reaps = kernel_reaps

    def root_alive(self) -> bool:
        if self._root_fd is None:
            return alive(self.root_pid)
        poller = select.poll()
        poller.register(self._root_fd, select.POLLIN)
        return not poller.poll(0)

    def kill_root(self) -> None:
        if self._root_fd is None:
            signal_all([self.root_pid], signal.SIGKILL)
            return
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(self._root_fd, signal.SIGKILL)

    def running_pids(self, descendants: bool = True) -> list[int]:
        """``descendants=False``: skip the process-table scan (a pid namespace's init dies last)."""
        pids: set[int] = set(self.cgroup.pids()) if self.cgroup else set()
        root_alive = self.root_alive()
        if root_alive and descendants and (self.cgroup is None or not self.kernel_reaps):
            # Without a cgroup, descendants are the only record (double forks can escape it).
            import psutil  # only here: the host backend, or no cgroup to read the tree from

            with contextlib.suppress(psutil.Error):
                pids.update(child.pid for child in psutil.Process(self.root_pid).children(recursive=True))
        pids.discard(self.root_pid)
        found = sorted(p for p in pids if alive(p))
        return [self.root_pid, *found] if root_alive else found

    def kill_steps(self, grace: float) -> Iterator[float]:
        """TERM, up to ``grace`` for the tree to go, then KILL until none is left: pauses to sleep.

        bwrap exits as soon as the command does, while the namespace's init may still be killing
        the rest: a normal exit (``grace`` 0), too, waits here until every process is gone.
        Under bwrap the root is the namespace's init: TERM it and the kernel kills the rest at
        once, leaving them no grace; so TERM goes to everything else first.

        Why a tree kill of its own here: a local call's processes run on this host, where we
        see them by cgroup and pidfd and nothing of ours runs beside them in the jail; the
        synchronous ``sandbox run`` shares these steps without an event loop. Docker calls are
        killed inside their container instead: by the warm jail's agent
        (:mod:`sandbox._jailside.agent`) or by the per-call jail's sh sweep.
        """
        victims = [p for p in self.running_pids() if p != self.root_pid or not self.kernel_reaps] if grace > 0 else []
        if victims:
            signal_all(victims, signal.SIGTERM)
            deadline = time.monotonic() + grace
            # Polling: no event tells us that processes in another pid namespace exited.
            while time.monotonic() < deadline and any(map(alive, victims)):
                yield 0.01
        # A task in uninterruptible sleep dies only when it leaves it; once SIGKILLed it can
        # never run user code again, so stop polling after a while rather than hang the call.
        give_up = time.monotonic() + KILL_WAIT_S
        # Under bwrap, killing the init kills its namespace, and the init is gone only once the
        # rest is: no scan of the process table is needed to know the call is over.
        while (pids := self.running_pids(descendants=not self.kernel_reaps)) and time.monotonic() < give_up:
            others = [p for p in pids if p != self.root_pid]
            if not others or self.kernel_reaps:
                self.kill_root()
            # Otherwise the root goes last: a subreaper (the Landlock launcher) adopts the orphans of
            # those killed, so they stay its descendants, found by the next scan, until none is left.
            signal_all(others, signal.SIGKILL)
            yield 0.002

    def forget_root(self) -> None:
        """Close the pidfd of the call's first process (a failed start, or the call's release)."""
        if self._root_fd is not None:
            os.close(self._root_fd)
            self._root_fd = None
