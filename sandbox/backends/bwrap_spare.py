"""The warm bubblewrap jail's spare, and the hold socket through which a held process is placed.

Apart from :mod:`sandbox.backends.bwrap_warm` because it lives between calls, on a thread of its
own: the spare is the next call's process, forked by the agent while the jail is idle and placed
by the jail's placer thread (see the module doc of :mod:`~sandbox.backends.bwrap_warm`), so that
a call's end waits for none of it.

**The hold socket.** A held process -- a spare, or a command forked for its call when no spare
waits -- writes one byte on a socket whose other end (ours) has ``SO_PASSCRED``: the kernel
stamps that byte with the writer's pid *as our namespace sees it* (:func:`held_pid`), so we learn
its host pid without trusting the agent's word, confine it, and only then write ``1``.
"""

from __future__ import annotations

import contextlib
import queue
import select
import socket
import struct
import threading
from typing import TYPE_CHECKING, Any

from sandbox.backends import cgroups, confine
from sandbox.errors import BackendUnavailable

if TYPE_CHECKING:
    from collections.abc import Callable

    from sandbox.backends.bwrap_agent import Agent
    from sandbox.backends.local import CgroupPool

HOLD_WAIT_S = 30.0  # a fork in a busy jail
_UCRED = struct.Struct("3i")  # pid, uid, gid


class Placer:
    """A jail's thread that makes its spares, so that a call's end does not wait for the next one's start.

    Not a ``ThreadPoolExecutor``: its workers are joined at interpreter exit, and a spare in the
    making may wait up to ``HOLD_WAIT_S`` for its fork; a daemon thread never holds up an exit.
    """

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def submit(self, job: Callable[[], None]) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="bwrap-placer", daemon=True)
            self._thread.start()
        self._jobs.put(job)

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            job()

    def stop(self) -> None:
        if self._thread is not None:
            self._jobs.put(None)
            self._thread = None


class Spare:
    """The next call's process: forked by the agent while the jail is idle, placed by our placer thread."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.group: cgroups.CallCgroup | None = None
        self.hold: socket.socket | None = None
        self.pid: int | None = None  # once placed and released
        self.placed = threading.Event()  # set when the thread is done, placed or not
        self._lock = threading.Lock()
        self._abandoned = False

    def make(self, pool: CgroupPool, profile: Any) -> None:
        """In the placer thread: a cgroup, the agent's fork, its pid from the kernel, its placement."""
        try:
            with self._lock:
                if self._abandoned:
                    return
                self.group = pool.take()
                self.hold, theirs = hold_pair()
            try:
                self.agent.link.send({"op": "spare", "id": self.agent.link.next_id(), "fds": 1}, [theirs.fileno()])
            finally:
                theirs.close()
            pid = held_pid_now(self.hold, HOLD_WAIT_S)
            if pid is not None:
                confine.confine(pid, profile, self.group, "bwrap")
                self.hold.send(b"1")
                self.pid = pid
        except (OSError, BackendUnavailable):
            pass  # not placed: never released, it dies with its hold socket; the call forks its own
        finally:
            self.placed.set()

    def close(self) -> None:
        if self.hold is not None:
            self.hold.close()

    def abandon(self) -> None:
        """Not to be used: a spare still held or waiting reads the end of its hold socket and exits."""
        with self._lock:
            self._abandoned = True
            if self.hold is not None:
                with contextlib.suppress(OSError):
                    self.hold.shutdown(socket.SHUT_RDWR)  # not close(): the placer may be reading it


def held_pid_now(hold: socket.socket, timeout: float) -> int | None:
    """The held process's pid (the kernel's credentials on its byte), waiting in this thread."""
    ready, _, _ = select.select([hold], [], [], timeout)
    if not ready:
        return None
    return held_pid(hold)


def held_pid(hold: socket.socket) -> int | None:
    """The pid the kernel stamped on the held process's byte; ``None``: it sent none (it ended).

    Raises ``BlockingIOError`` on our non-blocking end when the byte is not there yet.
    """
    data, ancillary, _flags, _addr = hold.recvmsg(1, socket.CMSG_SPACE(_UCRED.size))
    return _sender(data, ancillary)


def _sender(data: bytes, ancillary: list[tuple[int, int, bytes]]) -> int | None:
    if not data:
        return None
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
            pid, _uid, _gid = _UCRED.unpack(payload[: _UCRED.size])
            return int(pid)
    return None


def hold_pair() -> tuple[socket.socket, socket.socket]:
    """A hold socket: ours (``SO_PASSCRED``, non-blocking) and the end the command writes its byte on."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    ours.setblocking(False)
    return ours, theirs
