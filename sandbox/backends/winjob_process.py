"""A call's process in its job: the two output pipes, stdin, the wait, the exit code and the tree kill.

Apart from the jail (:mod:`sandbox.backends.winjob`), which decides what to start and starts it,
because this is what a started call is from then on: :class:`WinJobProcess` over its
:class:`~sandbox.backends.winjob_job.Job`, its output read by :class:`PipeStream` (a blocking
``ReadFile`` in a worker thread of its own), its exit code (``-9`` for a root the kill ended, an
NTSTATUS named by :func:`ntstatus_name` for a crash), and the handle helpers the jail's launch
shares with it.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

import anyio
from anyio.abc import ByteReceiveStream

from sandbox.backends.base import Process
from sandbox.backends.winjob_job import (
    DUPLICATE_SAME_ACCESS,
    ERROR_BROKEN_PIPE,
    ERROR_NO_DATA,
    INFINITE,
    KILLED_EXIT,
    NAME,
    Job,
)
from sandbox.errors import BackendUnavailable
from sandbox.threads import off_loop

if sys.platform == "win32":
    import _winapi
else:  # the module imports everywhere (the loader, ``sandbox check``); nothing here calls it
    _winapi: Any = None

if TYPE_CHECKING:
    from sandbox.backends.base import Stdin

KILL_WAIT_S = 5.0  # how long the job may take to report no active process after TerminateJobObject
READ_SIZE = 1 << 16

NTSTATUS_NAMES = {
    0xC0000005: "STATUS_ACCESS_VIOLATION",
    0xC000001D: "STATUS_ILLEGAL_INSTRUCTION",
    0xC0000094: "STATUS_INTEGER_DIVIDE_BY_ZERO",
    0xC00000FD: "STATUS_STACK_OVERFLOW",
    0xC0000409: "STATUS_STACK_BUFFER_OVERRUN",
    0xC0000017: "STATUS_NO_MEMORY",
    0xC000013A: "STATUS_CONTROL_C_EXIT",
    0xC0000135: "STATUS_DLL_NOT_FOUND",
    0xC0000142: "STATUS_DLL_INIT_FAILED",
    0x80000003: "STATUS_BREAKPOINT",
}


def ntstatus_name(code: int) -> str | None:
    """``"0xC0000005 STATUS_ACCESS_VIOLATION"`` for an exit code that is an NTSTATUS error or
    warning (the high bits of a crash), else ``None``."""
    code &= 0xFFFFFFFF
    if code < 0x80000000:
        return None
    name = NTSTATUS_NAMES.get(code)
    return f"0x{code:08X}" + (f" {name}" if name else "")


# -- pipes -------------------------------------------------------------------------------------------


class PipeStream(ByteReceiveStream):
    """One pipe's read end, read by a blocking ``ReadFile`` in a worker thread.

    A read abandoned by a cancellation keeps its chunk for the next ``receive``, and no two reads
    ever run at once (a lock); the handle is closed by whoever holds it last after EOF or ``aclose``.
    """

    def __init__(self, handle: int) -> None:
        self._handle = handle
        self._lock = threading.Lock()
        self._buffer: list[bytes] = []
        self._eof = False
        self._closing = False
        self._limiter: anyio.CapacityLimiter | None = None  # made on the loop: we are built in a worker thread

    def _read(self) -> None:
        assert sys.platform == "win32"
        with self._lock:
            if self._buffer or self._eof or self._closing:
                return
            try:
                data, _ = _winapi.ReadFile(self._handle, READ_SIZE)
            except OSError as exc:
                if getattr(exc, "winerror", None) not in (ERROR_BROKEN_PIPE, ERROR_NO_DATA):
                    raise
                data = b""
            if data:
                self._buffer.append(data)
            else:
                self._eof = True
                self._close_handle()

    def _close_handle(self) -> None:
        if self._handle:
            assert sys.platform == "win32"
            _winapi.CloseHandle(self._handle)
            self._handle = 0

    async def receive(self, max_bytes: int = READ_SIZE) -> bytes:  # noqa: ARG002 - a chunk as it comes
        while True:
            if self._buffer:
                return self._buffer.pop(0)
            if self._eof or self._closing:
                raise anyio.EndOfStream
            if self._limiter is None:  # our own: a blocked read must not hold one of anyio's default 40 threads
                self._limiter = anyio.CapacityLimiter(1)
            await anyio.to_thread.run_sync(self._read, abandon_on_cancel=True, limiter=self._limiter)

    async def aclose(self) -> None:
        self.close()

    def close(self) -> None:
        self._closing = True
        if self._lock.acquire(blocking=False):  # a read still blocked closes it on its EOF
            try:
                self._close_handle()
            finally:
                self._lock.release()


def anonymous_pipe() -> tuple[int, int]:
    """An anonymous pipe: (ours, the child's inheritable end); which end is which is the caller's."""
    assert sys.platform == "win32"
    read, write = _winapi.CreatePipe(None, 0)
    return read, write


def inheritable(handle: int) -> int:
    assert sys.platform == "win32"
    me = _winapi.GetCurrentProcess()
    dup = _winapi.DuplicateHandle(me, handle, me, 0, True, DUPLICATE_SAME_ACCESS)
    _winapi.CloseHandle(handle)
    return int(dup)


def close_handles(*handles: int) -> None:
    assert sys.platform == "win32"
    for h in handles:
        if h:
            with contextlib.suppress(OSError):
                _winapi.CloseHandle(h)


# -- process -----------------------------------------------------------------------------------------


class WinJobProcess(Process):
    def __init__(
        self, job: Job, hprocess: int, pid: int, stdout: PipeStream, stderr: PipeStream, stdin: int | None
    ) -> None:
        self.job = job
        self.hprocess = hprocess
        self.pid = pid
        self.stdout = stdout
        self.stderr = stderr
        self._stdin = stdin
        self.stdin_data: Stdin = None
        self.returncode: int | None = None
        self.killed = False
        self.on_release: Any = None

    def _wait_blocking(self) -> int:
        assert sys.platform == "win32"
        _winapi.WaitForSingleObject(self.hprocess, INFINITE)
        return int(_winapi.GetExitCodeProcess(self.hprocess))

    async def wait(self) -> int:
        if self.returncode is None:
            code = await anyio.to_thread.run_sync(self._wait_blocking, abandon_on_cancel=True)
            self.returncode = -9 if self.killed and code == KILLED_EXIT else code
        return self.returncode

    async def feed_stdin(self) -> None:
        handle, self._stdin = self._stdin, None
        if handle is None:
            return
        data = self.stdin_data
        try:
            if isinstance(data, bytes | bytearray):
                await off_loop(_write_all, handle, bytes(data))
            elif data is not None:
                async for chunk in data:
                    await off_loop(_write_all, handle, chunk)
        except OSError:
            pass  # the command closed its stdin (exited): what it did not read is dropped, as a pipe does
        finally:
            close_handles(handle)

    async def kill_tree(self, grace: float) -> None:  # noqa: ARG002 - Windows has no TERM to give a grace to
        with anyio.CancelScope(shield=True):
            if self.job.closed:
                return
            if self.job.active():
                self.killed = True
                await off_loop(self.job.terminate)
            deadline = time.monotonic() + KILL_WAIT_S
            while self.job.active():
                if time.monotonic() > deadline:
                    raise BackendUnavailable(
                        f"the job still reports {self.job.active()} active process(es) {KILL_WAIT_S:g} s after "
                        "TerminateJobObject",
                        backend=NAME,
                    )
                await anyio.sleep(0.01)
            with anyio.move_on_after(KILL_WAIT_S):
                await self.wait()

    def running_pids(self) -> list[int]:
        return self.job.pids()

    def peak_memory(self) -> int | None:
        return self.job.peak_memory()

    def release(self) -> None:
        # KILL_ON_JOB_CLOSE: closing the job handle kills anything a broken promise left in it.
        self.job.close()
        self.stdout.close()  # type: ignore[attr-defined]
        self.stderr.close()  # type: ignore[attr-defined]
        if self._stdin is not None:
            close_handles(self._stdin)
            self._stdin = None
        if self.hprocess:
            close_handles(self.hprocess)
            self.hprocess = 0
        if self.on_release is not None:
            self.on_release(self)


def _write_all(handle: int, data: bytes) -> None:
    assert sys.platform == "win32"
    view = memoryview(data)
    while view:
        written, _ = _winapi.WriteFile(handle, bytes(view[:READ_SIZE]))
        view = view[written:]
