"""The next call's Landlock launcher, started ahead and already in its cgroups.

A launcher's start (the interpreter, ``import ctypes``, the rules every call shares) and its move
into a call's cgroups (a cgroup v1 memory controller takes milliseconds to admit a process) are
both done by a thread while the previous call's command runs, so a call only tells a waiting
launcher its request. The cgroup is one of the jail's pool, taken for the call the launcher will
serve; a launcher that could not be placed gives it back and is confined the ordinary way.
"""

from __future__ import annotations

import contextlib
import os
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sandbox.backends import local
from sandbox.errors import BackendUnavailable
from sandbox.threads import off_loop

if TYPE_CHECKING:
    from collections.abc import Callable

    from sandbox.backends import cgroups
    from sandbox.backends.child import Child

Launcher = tuple["Child", int]  # the waiting launcher, and our end of its status pipe


@dataclass
class Spare:
    launcher: Launcher
    group: cgroups.CallCgroup | None  # the call's cgroups, the launcher in them already; None: not placed

    def discard(self, pool: local.CgroupPool) -> None:
        proc, status_r = self.launcher
        local.discard_held(proc)
        os.close(status_r)
        if self.group is not None:
            pool.give_back(self.group)


class Ahead:
    """At most one launcher started ahead (:meth:`start` on the loop, the work in a thread)."""

    def __init__(self, spawn: Callable[[], Launcher], pool: local.CgroupPool) -> None:
        self._spawn = spawn
        self._pool = pool
        self._thread: threading.Thread | None = None
        # the thread's work: the launcher (None: none could start), the group taken, whether it is in it
        self._done: tuple[Launcher | None, cgroups.CallCgroup | None, bool] | None = None

    def start(self) -> None:
        if self._thread is not None or self._done is not None:
            return
        group = self._pool.take()  # on the loop: the pool is the loop's
        self._thread = threading.Thread(target=self._run, args=(group,), name="landlock-spare", daemon=True)
        self._thread.start()

    def _run(self, group: cgroups.CallCgroup | None) -> None:
        try:
            launcher = self._spawn()
        except (BackendUnavailable, OSError):  # out of processes now: the call starts its own, or says why
            self._done = (None, group, False)
            return
        placed = False
        if group is not None:
            with contextlib.suppress(OSError):  # confined the ordinary way when its call comes
                group.add(launcher[0].pid)
                placed = True
        self._done = (launcher, group, placed)

    async def take(self) -> Spare | None:
        """The launcher started ahead if it still waits, or ``None`` (a new one is the caller's)."""
        thread, self._thread = self._thread, None
        if thread is not None and thread.is_alive():  # done already, as a pause between calls lets it: no hop
            await off_loop(thread.join)
        done, self._done = self._done, None
        if done is None:
            return None
        launcher, group, placed = done
        if group is not None and not placed:
            self._pool.give_back(group)
            group = None
        if launcher is None:
            return None
        spare = Spare(launcher, group)
        if launcher[0].popen.poll() is not None:  # killed from outside meanwhile
            spare.discard(self._pool)
            return None
        return spare

    async def close(self) -> None:
        spare = await self.take()
        if spare is not None:
            spare.discard(self._pool)
