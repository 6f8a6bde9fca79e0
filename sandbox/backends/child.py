"""A child process driven without asyncio's child watcher: pipes read when ready, exit by pidfd.

``anyio.open_process`` on asyncio starts a thread per child to ``waitpid`` it; a pidfd is
readable once the child exits, so the event loop can wait for it like for a pipe. This keeps
per-call overhead down and works the same on every anyio backend.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
from typing import TYPE_CHECKING

import anyio
from anyio.abc import ByteReceiveStream

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

PIPE_SIZE = 1 << 20  # a bigger pipe halves the wakeups when a command floods its output
# A quarter of the pipe a read: 1 MiB reads moved a flood at half the speed (about 2.2 GiB/s
# against 3.7-4.0 for 128-256 KiB, bench/bench_streams.py): each read's new buffer and the
# kernel's copy into it no longer fit the CPU's cache.
READ_SIZE = 1 << 18


class FdReceiveStream(ByteReceiveStream):
    """The read end of a pipe as an anyio byte stream."""

    def __init__(self, fd: int) -> None:
        os.set_blocking(fd, False)
        with contextlib.suppress(OSError):
            fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
        self.fd = fd

    def receive_ready(self, max_bytes: int = READ_SIZE) -> bytes | None:
        """What the pipe holds now (``b""`` at its end), or ``None`` when it is empty.

        A flood's chunks read without a coroutine each (:func:`sandbox.exec._pump`): a fifth of
        the executor's time per chunk went to ``receive``'s awaitable and ``async for``.
        """
        if self.fd < 0:
            raise anyio.ClosedResourceError
        try:
            return os.read(self.fd, max_bytes)
        except BlockingIOError:
            return None

    async def receive(self, max_bytes: int = READ_SIZE) -> bytes:
        while (data := self.receive_ready(max_bytes)) is None:
            await anyio.wait_readable(self.fd)
        if not data:
            raise anyio.EndOfStream
        return data

    def close(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)

    async def aclose(self) -> None:
        self.close()


async def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            await anyio.wait_writable(fd)


async def feed_fd(fd: int, data: bytes | ByteReceiveStream) -> None:
    """Write ``data`` (or copy a stream as it arrives) to a non-blocking pipe; the caller closes it.

    EPIPE means the reader stopped reading: the rest has nowhere to go, which is no error.
    """
    try:
        if isinstance(data, bytes):
            await _write_all(fd, data)
        else:
            async for chunk in data:
                await _write_all(fd, chunk)
    except BrokenPipeError:
        pass


class Child:
    """``subprocess.Popen`` with stdin closed, stdout/stderr as streams and an awaitable exit."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        pass_fds: Sequence[int] = (),
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        new_session: bool = False,
        stdin: bool = False,
    ) -> None:
        self.popen = subprocess.Popen(
            list(argv),
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=tuple(pass_fds),
            cwd=cwd,
            env=dict(env) if env is not None else None,
            start_new_session=new_session,
        )
        assert self.popen.stdout is not None and self.popen.stderr is not None
        self.pid = self.popen.pid
        self.stdout = FdReceiveStream(os.dup(self.popen.stdout.fileno()))
        self.stderr = FdReceiveStream(os.dup(self.popen.stderr.fileno()))
        self.popen.stdout.close()
        self.popen.stderr.close()
        self.stdin_fd: int | None = None
        if self.popen.stdin is not None:
            self.stdin_fd = os.dup(self.popen.stdin.fileno())
            self.popen.stdin.close()
            os.set_blocking(self.stdin_fd, False)
        try:
            self._pidfd: int | None = os.pidfd_open(self.pid)
        except (AttributeError, OSError):  # kernel < 5.3: fall back to a waiting thread
            self._pidfd = None

    def release_hold(self, line: bytes, *, keep_open: bool) -> None:
        """Write the line a held child waits for on stdin; close stdin unless data follows."""
        assert self.stdin_fd is not None
        view = memoryview(line)[os.write(self.stdin_fd, line) :]  # into an empty pipe: all, unless it is long
        if view:  # a long request fills the pipe: the child reads it meanwhile
            os.set_blocking(self.stdin_fd, True)
            try:
                while view:
                    view = view[os.write(self.stdin_fd, view) :]
            finally:
                os.set_blocking(self.stdin_fd, False)
        if not keep_open:
            os.close(self.stdin_fd)
            self.stdin_fd = None

    async def feed(self, data: bytes | ByteReceiveStream) -> None:
        """Write ``data`` (or copy a stream as it arrives) to the child's stdin, then close it.

        EPIPE means the child stopped reading: the rest has nowhere to go, which is no error.
        """
        fd = self.stdin_fd
        if fd is None:
            return
        try:
            await feed_fd(fd, data)
        finally:
            self.stdin_fd = None
            os.close(fd)

    @property
    def returncode(self) -> int | None:
        return self.popen.returncode

    async def wait(self) -> int:
        if self.popen.returncode is not None:
            return self.popen.returncode
        if self._pidfd is None:
            return await anyio.to_thread.run_sync(self.popen.wait, abandon_on_cancel=True)
        await anyio.wait_readable(self._pidfd)
        code = self.popen.wait()
        self._close_pidfd()
        return code

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.popen.kill()

    def _close_pidfd(self) -> None:
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None

    def close(self) -> None:
        """Release the pipes and the pidfd (the process itself must already be reaped or killed)."""
        self.stdout.close()
        self.stderr.close()
        if self.stdin_fd is not None:
            os.close(self.stdin_fd)
            self.stdin_fd = None
        self._close_pidfd()

    async def aclose(self) -> None:
        self.close()
