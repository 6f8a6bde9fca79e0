"""What the bwrap and host backends share: per-call cgroups, rlimits and the tree kill.

A local call's processes are known two ways: as descendants of the call's first process (for
bwrap, the pid namespace's init, which adopts every orphan of the namespace) and as members
of the call's cgroups (which nothing inside can leave). The kill signals the union of both.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import time
from typing import TYPE_CHECKING

import anyio
import psutil

from sandbox.backends import cgroups
from sandbox.backends.base import Jail, Process
from sandbox.errors import BackendUnavailable, InvalidArgument, map_errors

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from pathlib import Path

    from sandbox.backends.child import Child
    from sandbox.mounts import CopyTree
    from sandbox.profile import Profile


KILL_WAIT_S = 10.0


class CgroupPool:
    """A jail's idle call cgroups, reused so a call pays for an attach, not a creation."""

    def __init__(self, profile: Profile) -> None:
        self.profile = profile
        self.idle: list[cgroups.CallCgroup] = []

    def take(self) -> cgroups.CallCgroup | None:
        if self.idle:
            group = self.idle.pop()
            group.rearm()
            return group
        return call_cgroup(self.profile)

    def give_back(self, group: cgroups.CallCgroup) -> None:
        leftovers = sorted(group.pids())
        if leftovers:  # a broken promise above: kill, and never share this cgroup again
            signal_all(leftovers, signal.SIGKILL)
            group.remove()
        else:
            self.idle.append(group)

    def close(self) -> None:
        while self.idle:
            self.idle.pop().remove()


def call_cgroup(profile: Profile) -> cgroups.CallCgroup | None:
    """Cgroups for the profile's memory/pids/cpu limits, on the controllers this host has."""
    lim = profile.limits
    wanted = {"memory": (lim.memory, "memory"), "pids": (lim.pids, "pids"), "cpus": (lim.cpus, "cpu")}
    usable = {
        key: value for key, (value, controller) in wanted.items()
        if value is not None and isinstance(cgroups.hierarchies()[controller], cgroups.Hierarchy)
    }
    # Tree tracking wants a cgroup even when no limit is set; pids.max "max" costs nothing.
    if not usable and isinstance(cgroups.hierarchies()["pids"], cgroups.Hierarchy):
        usable = {"pids": 2**22}
    if not usable:
        return None
    limits = cgroups.Limits(memory=_int(usable.get("memory")), pids=_int(usable.get("pids")),
                            cpus=usable.get("cpus"))
    with map_errors("cannot create the call's cgroup", BackendUnavailable):
        return cgroups.CallCgroup.create(limits)


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)


def rlimits(profile: Profile) -> list[tuple[int, int]]:
    lim = profile.limits
    pairs = [(resource.RLIMIT_CPU, lim.cpu_time_s), (resource.RLIMIT_FSIZE, lim.file_size),
             (resource.RLIMIT_NOFILE, lim.nofile)]
    return [(res, int(value)) for res, value in pairs if value is not None]


def confine(pid: int, profile: Profile, group: cgroups.CallCgroup | None) -> None:
    """Put a held (not yet running the command) process in its cgroups and set its rlimits."""
    with map_errors("cannot confine the call's first process", BackendUnavailable):
        if group is not None:
            group.add(pid)
        for res, value in rlimits(profile):
            resource.prlimit(pid, res, (value, value))


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def signal_all(pids: Sequence[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


class LocalProcess(Process):
    """A call started by us on this host, under bwrap (``kernel_reaps``: pid namespace) or not."""

    def __init__(self, proc: Child, root_pid: int, cgroup: cgroups.CallCgroup | None,
                 on_release: Callable[[LocalProcess], None], *, kernel_reaps: bool) -> None:
        """``on_release`` hands the cgroup back to the jail's pool and forgets the process."""
        self._proc = proc
        self.root_pid = root_pid
        self.cgroup = cgroup
        self.kernel_reaps = kernel_reaps
        self.on_release = on_release
        self.stdout = proc.stdout
        self.stderr = proc.stderr
        self.returncode: int | None = None
        self.stdin_data: bytes | None = None

    async def feed_stdin(self) -> None:
        await self._proc.feed(self.stdin_data or b"")

    async def wait(self) -> int:
        self.returncode = await self._proc.wait()
        return self.returncode

    def running_pids(self) -> list[int]:
        pids: set[int] = set(self.cgroup.pids()) if self.cgroup else set()
        if self.cgroup is None or not self.kernel_reaps:
            # Without a cgroup, descendants are the only record (double forks can escape it).
            with contextlib.suppress(psutil.Error):
                pids.update(child.pid for child in psutil.Process(self.root_pid).children(recursive=True))
        pids.add(self.root_pid)
        return sorted(p for p in pids if _alive(p))

    async def kill_tree(self, grace: float) -> None:
        if self.kernel_reaps and self.returncode is not None:
            # bwrap exits only after its child, the namespace's init, has: and the kernel lets
            # an init finish exiting only once every process of its namespace is gone.
            return
        # Under bwrap the root is the namespace's init: TERM it and the kernel kills the rest
        # at once, leaving them no grace; so TERM goes to everything else first.
        victims = [p for p in self.running_pids() if p != self.root_pid or not self.kernel_reaps]
        if grace > 0:
            signal_all(victims, signal.SIGTERM)
            deadline = time.monotonic() + grace
            # Polling: no event tells us that processes in another pid namespace exited.
            while time.monotonic() < deadline and any(map(_alive, victims)):  # noqa: ASYNC110
                await anyio.sleep(0.01)
        with anyio.CancelScope(shield=True):
            # A task in uninterruptible sleep dies only when it leaves it; once SIGKILLed it can
            # never run user code again, so stop polling after a while rather than hang the call.
            give_up = time.monotonic() + KILL_WAIT_S
            while (pids := self.running_pids()) and time.monotonic() < give_up:
                signal_all([self.root_pid, *pids], signal.SIGKILL)
                await anyio.sleep(0.002)
            with anyio.move_on_after(KILL_WAIT_S):
                await self.wait()

    def oom_killed(self) -> bool:
        return self.cgroup.oom_killed() if self.cgroup else False

    def peak_memory(self) -> int | None:
        return self.cgroup.peak_memory() if self.cgroup else None

    def release(self) -> None:
        self._proc.close()
        self.on_release(self)


class LocalJail(Jail):
    """What the bwrap and host jails share: live calls, their cgroup pool, the private tree."""

    def __init__(self, workspace: Path, profile: Profile, tree: CopyTree | None) -> None:
        self.workspace = workspace
        self.profile = profile
        self.tree = tree
        self._live: set[LocalProcess] = set()
        self._pool = CgroupPool(profile)

    def _released(self, proc: LocalProcess) -> None:
        self._live.discard(proc)
        if proc.cgroup is not None:
            self._pool.give_back(proc.cgroup)
            proc.cgroup = None

    def _check_spawn(self, argv: Sequence[str]) -> None:
        if self._closed:
            raise InvalidArgument("the jail is closed")
        if not argv:
            raise InvalidArgument("empty argv: name a command to run")

    async def _shutdown(self) -> None:
        for proc in list(self._live):
            await proc.kill_tree(0)
            proc.release()
        self._pool.close()
