"""Keep a call from filling the host's disk: watch the filesystems its jail writes, stop it at a bound.

``RLIMIT_FSIZE`` caps one file; nothing else stops a call from writing the private copy, an
overlay's upper dir, the session's scratch directory or a ``rw`` workspace until the disk that
holds them is full, and an ordinary user has no quota or mount to cap them with. So while a call
runs, :func:`watch` looks at ``statvfs`` of each filesystem holding one of the jail's writable
host directories (:attr:`~sandbox.backends.base.Jail.host_writable`) and returns a
:class:`Breach` when

- the free space drops below the reserve (``limits.disk_reserve``; unset: 1 GiB or 5% of the
  filesystem, whichever is smaller). A disk that others filled is not the call's doing: below the
  reserve already, a call may take a little more (:data:`SLACK`), and none below half of it; or
- the call took more than ``limits.disk_write`` (the drop of free space since it began, the
  watched filesystems together; other writers to the same disks count too, so it is off by default).

The executor then kills the call's tree at once (a timeout's kill, without the grace: a writer
gets no time to write on) and fails the call with TOOL_FAILED, ``errno`` ENOSPC. A call that ends
between two looks gets one look more (:meth:`Watch.last`): past ``limits.disk_write``, it fails the
same way. The looks are
adaptive: the nearer a bound, the sooner the next one (the headroom at :data:`ASSUMED_RATE`,
between :data:`MIN_TICK` and :data:`MAX_TICK`), so the reserve absorbs what a writer at disk speed
adds between two looks; far from any bound a look costs one ``statvfs`` per filesystem per quarter
second, off the event loop (the first, as the call starts, on it). The jail's ``/tmp`` and home
are tmpfs: memory, capped by their own size.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from typing import TYPE_CHECKING

import anyio

from sandbox.errors import ToolFailed
from sandbox.threads import off_loop

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from pathlib import Path

    from sandbox.profile_tables import Limits

DEFAULT_RESERVE = 2**30
DEFAULT_RESERVE_SHARE = 0.05  # of the filesystem's size, when that is less than DEFAULT_RESERVE
ASSUMED_RATE = 2 * 2**30  # bytes per second a writer may add between two looks (NVMe, a tmpfs)
SLACK = 16 * 2**20  # what a call may take below the reserve (at most a sixteenth of it)
MIN_TICK = 0.01
MAX_TICK = 0.25


@dataclass(frozen=True)
class Space:
    """One filesystem's space at one look, in bytes: what an unprivileged writer can still take."""

    free: int
    size: int


Look = dict[str, Space]  # one watched directory per filesystem -> its space


@dataclass(frozen=True)
class Breach:
    """The bound a call passed, and where."""

    bound: str  # "limits.disk_reserve" or "limits.disk_write"
    limit: int
    used: int  # bytes the watched filesystems lost since the call began
    free: int
    path: str

    def error(self) -> ToolFailed:
        what = "left less free space than" if self.bound == "limits.disk_reserve" else "wrote more than"
        return ToolFailed(
            f"the command was killed: it {what} {self.bound} ({self.limit} bytes) on the filesystem of "
            f"{self.path} ({self.free} bytes free, {self.used} taken during the call). Remove what it wrote "
            "(in copy or overlay mode, discard the session's changes), or raise the limit",
            errno="ENOSPC",
            bound=self.bound,
            limit=self.limit,
            used=self.used,
            free=self.free,
            path=self.path,
        )


def _space(path: str) -> Space | None:
    try:  # statvfs's f_bavail and f_blocks on POSIX, GetDiskFreeSpaceExW on Windows (winjob)
        usage = shutil.disk_usage(path)
    except OSError:  # removed under us (a closing jail): nothing left there to fill
        return None
    return Space(usage.free, usage.total)


class Guard:
    """The bounds of one jail's calls over its writable host directories."""

    def __init__(self, paths: Sequence[Path], limits: Limits) -> None:
        self.paths = [str(p) for p in paths]
        self.reserve_asked = limits.disk_reserve
        self.write_limit = limits.disk_write

    def reserve(self, space: Space) -> int:
        if self.reserve_asked is not None:
            return self.reserve_asked
        return min(DEFAULT_RESERVE, int(space.size * DEFAULT_RESERVE_SHARE))

    def first_look(self) -> Look:
        """One directory per filesystem (by ``st_dev``), with its space: later looks take only those."""
        seen: dict[int, str] = {}
        for path in self.paths:
            try:
                seen.setdefault(os.stat(path).st_dev, path)
            except OSError:
                continue
        return self.look(seen.values())

    @staticmethod
    def look(paths: Iterable[str]) -> Look:
        return {path: space for path in paths if (space := _space(path)) is not None}

    def check(self, start: Look, now: Look) -> tuple[Breach | None, int]:
        """The bound ``now`` passes, if any, and the bytes left before the nearest one."""
        used = sum(max(0, start[p].free - space.free) for p, space in now.items() if p in start)
        headroom = DEFAULT_RESERVE
        for path, space in now.items():
            reserve = self.reserve(space)
            left = _room(space.free, start.get(path, space).free, reserve)
            if left < 0:
                return Breach("limits.disk_reserve", reserve, used, space.free, path), 0
            headroom = min(headroom, left)
        if self.write_limit is not None:
            if used > self.write_limit:
                path = max(now, key=lambda p: start[p].free - now[p].free if p in start else 0)
                return Breach("limits.disk_write", self.write_limit, used, now[path].free, path), 0
            headroom = min(headroom, self.write_limit - used)
        return None, headroom


def _room(free: int, began: int, reserve: int) -> int:
    """Bytes a call may still take of a filesystem with ``free`` bytes left (``began`` at its start).

    A call that began above the reserve: down to it. One that began below it (others filled the
    disk, or earlier calls took their slack): :data:`SLACK` more (a sixteenth of the reserve at
    most: the session's own records, a build's few files; else no call would run), never past half
    the reserve; one that began below that half: nothing.
    """
    if began >= reserve:
        floor = reserve
    elif began >= reserve // 2:
        floor = max(began - min(reserve // 16, SLACK), reserve // 2)
    else:
        floor = began
    return free - floor


def for_jail(paths: Sequence[Path], limits: Limits) -> Guard | None:
    """The guard of a jail that writes ``paths`` on the host; ``None`` when it writes none."""
    return Guard(paths, limits) if paths else None


class Watch:
    """One call's watch: the first look as it starts (on the loop: microseconds, where a thread's
    round trip would cost every call more), :meth:`breach` while it runs, :meth:`last` once it ended."""

    def __init__(self, guard: Guard) -> None:
        self.guard = guard
        self.start = guard.first_look()

    async def breach(self) -> Breach:
        """Look until a bound is passed (the caller cancels this when the call ends first)."""
        now = self.start
        while True:
            breach, headroom = self.guard.check(self.start, now)
            if breach is not None:
                return breach
            await anyio.sleep(min(MAX_TICK, max(MIN_TICK, headroom / ASSUMED_RATE)))
            now = await off_loop(self.guard.look, list(self.start))

    def last(self) -> Breach | None:
        """``limits.disk_write``, if the ended call passed it: a writer fast enough to finish between
        two looks (hundreds of MiB into the page cache in tens of milliseconds) fails all the same.
        Not the reserve: a short call ending near it would answer for what others wrote meanwhile,
        and a call past it leaves the next one starting below it, with :data:`SLACK` at most."""
        breach = self.guard.check(self.start, self.guard.look(list(self.start)))[0]
        return breach if breach is not None and breach.bound == "limits.disk_write" else None
