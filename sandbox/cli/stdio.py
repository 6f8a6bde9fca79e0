"""The ``sandbox run`` process's own stdin and stdout/stderr, driven by the event loop (full path).

No thread per call (a fork bomb in the jail must not be able to starve us of one) and no
blocking write: a full pipe downstream waits in the loop, so the kill on timeout still happens.
Our stdin is copied to the command as it arrives (``yes | sandbox run -- head -1`` ends), never
read whole first, and never handed over as a descriptor: the jail would get a host file it could
reopen through ``/proc/self/fd``. A terminal on stdin is not forwarded (as before: stdin closed).
A closed stdout or stderr is what SIGPIPE is to a Unix tool: the call stops, quietly, 141.
"""

from __future__ import annotations

import errno
import os
import select
import socket
import stat
import sys
from typing import TYPE_CHECKING

import anyio
from anyio.abc import ByteReceiveStream

if TYPE_CHECKING:
    from collections.abc import Callable

READ_SIZE = 1 << 16


class StdinStream(ByteReceiveStream):
    """Our fd 0 as a byte stream, without changing its flags (the file description is shared)."""

    def __init__(self, fd: int, pollable: bool) -> None:
        self.fd = fd
        self.pollable = pollable
        self.done = False

    async def receive(self, max_bytes: int = READ_SIZE) -> bytes:
        if self.done:
            raise anyio.EndOfStream
        try:
            if sys.platform == "win32":  # no readiness to wait on for a pipe there: a worker thread reads
                data = await anyio.to_thread.run_sync(os.read, self.fd, max_bytes, abandon_on_cancel=True)
            else:
                if self.pollable:
                    await anyio.wait_readable(self.fd)
                data = os.read(self.fd, max_bytes)
        except OSError:  # EIO and the like: stdin is gone, which is its end for the command
            data = b""
        if not data:
            self.done = True
            raise anyio.EndOfStream
        return data

    async def aclose(self) -> None:
        self.done = True


def stdin_source(fd: int = 0) -> StdinStream | None:
    """Our stdin to forward, or ``None`` when there is none or it is a terminal."""
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return None
    if os.isatty(fd):
        return None
    # Pipes and sockets can be waited on; regular files and devices are always ready (and
    # the event loop refuses to watch them).
    return StdinStream(fd, stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode))


class Sink:
    """Writes to fd 1 or 2 without blocking the loop; ``on_closed`` once when the reader has gone."""

    def __init__(self, fd: int, on_closed: Callable[[], None]) -> None:
        self.fd = fd
        self.on_closed = on_closed
        self.closed = False
        self._own: int | None = None
        self._sock: socket.socket | None = None
        self._poll = False  # wait until writable, then write at most PIPE_BUF: never blocks
        self._open()

    def _open(self) -> None:
        if sys.platform == "win32":  # no /proc nor readiness there: writes in a worker thread
            return
        try:
            mode = os.fstat(self.fd).st_mode
        except OSError:
            self.closed = True
            return
        if stat.S_ISSOCK(mode):
            self._sock = socket.socket(fileno=os.dup(self.fd))
        elif stat.S_ISFIFO(mode) or os.isatty(self.fd):
            # A new open file description of the same pipe or terminal: O_NONBLOCK on it is
            # ours alone, where setting it on fd 1 would change it for the shell and its jobs.
            try:
                self._own = os.open(f"/proc/self/fd/{self.fd}", os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError as exc:
                if stat.S_ISFIFO(mode) and exc.errno == errno.ENXIO:  # no reader any more
                    self._gone()
                self._poll = True  # someone else's pipe (EACCES): a free slot takes PIPE_BUF at once
        # Anything else (a file, /dev/null) takes a write at once: plain writes.

    async def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view and not self.closed:
            try:
                view = view[await self._write_some(view) :]
            except OSError:  # EPIPE, ECONNRESET, EIO (the terminal hung up): nobody takes it
                self._gone()

    async def _write_some(self, view: memoryview) -> int:
        if sys.platform == "win32":
            return await anyio.to_thread.run_sync(os.write, self.fd, view)
        while True:
            try:
                if self._sock is not None:
                    return self._sock.send(view, socket.MSG_DONTWAIT)
                if self._poll:
                    # Writable means a free pipe slot, and a slot takes PIPE_BUF bytes at once.
                    await anyio.wait_writable(self.fd)
                    return os.write(self.fd, view[: select.PIPE_BUF])
                return os.write(self._own if self._own is not None else self.fd, view)
            except BlockingIOError:
                if self._sock is not None:
                    await anyio.wait_writable(self._sock)
                else:
                    await anyio.wait_writable(self._own if self._own is not None else self.fd)

    def _gone(self) -> None:
        if not self.closed:
            self.closed = True
            self.on_closed()

    def close(self) -> None:
        if self._own is not None:
            os.close(self._own)
            self._own = None
        if self._sock is not None:
            self._sock.close()  # our dup; fd 1 itself stays open
            self._sock = None
