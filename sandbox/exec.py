"""Run one argv in a jail: two streams apart, bounded capture, timeout and abort kill the tree.

Output is delivered to ``on_stdout``/``on_stderr`` as it arrives and kept per stream as a
bounded head and tail, so memory stays flat whatever the command prints. The call returns
only when every process it started is dead: after a normal exit leftovers are killed at once;
on timeout or abort they get TERM, a grace period, then KILL. A caller's cancellation gets the
same treatment, shielded, and is then re-raised (trio's rule: never leave a child behind).
A streamed stdin is copied while the command runs and dropped once it has exited. The timeout
is the profile's ``timeouts.default_s`` unless asked for, up to its ``timeouts.max_s``.
:func:`checked_argv` makes the jail itself answer 127 (not found) or 126 (not executable).
"""

from __future__ import annotations

import inspect
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel
from pydantic import BaseModel

from sandbox import calls, diskguard, gitsweep
from sandbox.calls import check_timeout
from sandbox.errors import SandboxError

if TYPE_CHECKING:
    from anyio.abc import ByteReceiveStream

    from sandbox.backends.base import Jail, Process, Stdin

OutputCallback = Callable[[bytes], Awaitable[None] | None]
YIELD_EVERY = 64  # chunks read without waiting between two checkpoints


class Capture:
    """Keeps the first and last ``limit/2`` bytes of a stream and counts the rest."""

    def __init__(self, limit: int) -> None:
        self.head_limit = limit // 2
        self.tail_limit = limit - self.head_limit
        self.head = bytearray()
        self.tail: deque[bytes] = deque()
        self.tail_size = 0
        self.total = 0

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.head_limit - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if not chunk:
            return
        self.tail.append(chunk)
        self.tail_size += len(chunk)
        while self.tail_size - len(self.tail[0]) >= self.tail_limit:
            self.tail_size -= len(self.tail.popleft())

    @property
    def truncated(self) -> bool:
        return self.total > self.head_limit + self.tail_limit

    def text(self) -> str:
        tail = b"".join(self.tail)
        if not self.truncated:
            return (bytes(self.head) + tail).decode("utf-8", errors="replace")
        tail = tail[-self.tail_limit :]
        omitted = self.total - len(self.head) - len(tail)
        marker = f"\n[... {omitted} bytes omitted; {self.total} bytes in all ...]\n"
        return self.head.decode("utf-8", errors="replace") + marker + tail.decode("utf-8", errors="replace")


class ExecResult(BaseModel):
    exit_code: int
    signal: int | None
    timed_out: bool
    aborted: bool
    stdout: str
    stderr: str
    stdout_bytes: int
    stderr_bytes: int
    stdout_truncated: bool
    stderr_truncated: bool
    duration_ms: float
    spawn_ms: float
    kill_ms: float | None = None
    backend: str
    mount: str
    oom_killed: bool = False
    peak_memory_bytes: int | None = None
    network: dict[str, Any] | None = None  # allowlist: {mode, allow, deny, ask, denials} of this call
    kernel_denials: dict[str, Any] | None = None  # landlock with audit: {source, events, omitted, complete}
    quarantined: list[dict[str, str]] | None = None  # rw: what git would obey that the call left (gitsweep)


async def _pump(stream: ByteReceiveStream, capture: Capture, callback: OutputCallback | None) -> None:
    # A pipe's (FdReceiveStream, not imported: it needs fcntl, which Windows lacks): no coroutine per chunk.
    read_now = getattr(stream, "receive_ready", None)
    ready = 0
    while True:
        chunk = read_now() if read_now is not None else None
        if chunk is None:  # nothing there now: wait (the loop runs meanwhile)
            try:
                chunk = await stream.receive()
            except anyio.EndOfStream:
                return
        elif not chunk:
            return
        else:
            ready += 1
            if ready % YIELD_EVERY == 0:  # a flood that never lets the pipe run dry still lets the deadline in
                await anyio.lowlevel.checkpoint()
        capture.feed(chunk)
        if callback is not None:
            maybe = callback(chunk)
            if maybe is not None and inspect.isawaitable(maybe):  # (a plain function's None: no check)
                await maybe


async def _feed(proc: Process, scope: anyio.CancelScope) -> None:
    with scope:
        await proc.feed_stdin()


class _Outcome:
    timed_out = False
    aborted = False
    disk: diskguard.Breach | None = None  # the call passed a disk bound and was killed for it
    kill_ms: float | None = None


async def _supervise(
    proc: Process, limit: float, abort: anyio.Event | None, grace: float, guard: diskguard.Guard | None
) -> _Outcome:
    outcome = _Outcome()
    watch = diskguard.Watch(guard) if guard is not None else None
    async with anyio.create_task_group() as tg:

        async def watch_disk() -> None:
            assert watch is not None
            outcome.disk = await watch.breach()
            tg.cancel_scope.cancel()

        async def watch_abort() -> None:
            assert abort is not None
            await abort.wait()
            outcome.aborted = True
            tg.cancel_scope.cancel()

        if abort is not None:
            tg.start_soon(watch_abort)
        if watch is not None:
            tg.start_soon(watch_disk)
        with anyio.move_on_after(limit) as deadline:
            await proc.wait()
        outcome.timed_out = deadline.cancelled_caught
        if abort is not None or guard is not None:  # (a cancel costs a task's repr in anyio: none when idle)
            tg.cancel_scope.cancel()
    ended = outcome.disk is None and not (outcome.timed_out or outcome.aborted)
    if ended and watch is not None and watch.guard.write_limit is not None:
        # It may have written past disk_write between two looks: one look more, on the loop (microseconds,
        # as the first), and only where disk_write is set (it is off by default).
        outcome.disk = watch.last()
    stop = time.monotonic()
    # Leftovers of a normal exit get no grace: the call is over, nothing may outlive it. Nor does a
    # disk filler: a grace would be more time to write.
    await proc.kill_tree(grace if outcome.timed_out or outcome.aborted else 0)
    if outcome.disk is not None:
        outcome.kill_ms = (time.monotonic() - stop) * 1000
    if outcome.timed_out or outcome.aborted:
        outcome.kill_ms = (time.monotonic() - stop) * 1000
    return outcome


def _lone_error(exc: BaseException) -> SandboxError | None:
    """The one SandboxError a task group wrapped (a backend failing mid-call), if that is all it holds."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc if isinstance(exc, SandboxError) else None


async def run(
    jail: Jail,
    argv: Sequence[str],
    *,
    timeout: float | None = None,
    on_stdout: OutputCallback | None = None,
    on_stderr: OutputCallback | None = None,
    abort: anyio.Event | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    stdin: Stdin = None,
    capture_bytes: int | None = None,
    network: bool = True,
    runner: bool = False,
) -> ExecResult:
    """Run ``argv`` in ``jail``; see the module docstring for the guarantees.

    ``capture_bytes`` overrides the profile's per-stream capture (for machine-read output).
    ``network=False``: no forwarder to the allowlist proxy beside it (the file tools need none).
    ``runner``: ``argv`` is the jail's :meth:`~sandbox.backends.base.Jail.runner_argv`.
    In an allowlist jail the result's ``network`` lists the connections refused during the call.
    """
    profile = jail.profile
    limit = check_timeout(timeout, profile)
    grace = profile.timeouts.kill_grace_s
    keep = capture_bytes or profile.limits.capture_bytes
    out, err = Capture(keep), Capture(keep)
    started = time.monotonic()
    egress = jail.egress if network else None
    mark = egress.mark() if egress is not None else 0
    guard = diskguard.for_jail(jail.host_writable, profile.limits)
    sweep = gitsweep.Call(jail)  # rw: git's state before the call, swept once its processes are dead
    try:
        proc = await jail.spawn(list(argv), env=env, cwd=cwd, stdin=stdin, network=network, runner=runner)
    except BaseException:
        await sweep.end()
        raise
    spawned = time.monotonic()
    try:
        async with anyio.create_task_group() as tg:
            feeding = anyio.CancelScope()
            if stdin is not None:
                tg.start_soon(_feed, proc, feeding)
            tg.start_soon(_pump, proc.stdout, out, on_stdout)
            tg.start_soon(_pump, proc.stderr, err, on_stderr)
            outcome = await _supervise(proc, limit, abort, grace, guard)
            if stdin is not None:  # a streamed stdin may never end (`yes | sandbox run -- head -1`)
                feeding.cancel()
        returncode = await proc.wait()
        denied = await proc.kernel_denials()
    except BaseException as exc:
        with anyio.CancelScope(shield=True):
            await proc.kill_tree(grace)
        lone = _lone_error(exc)
        if lone is not None and lone is not exc:
            raise lone from exc
        raise
    finally:
        oom, peak = proc.oom_killed(), proc.peak_memory()
        proc.release()
        quarantined = await sweep.end()
    if outcome.disk is not None:  # TOOL_FAILED (ENOSPC); the jail and its session stay usable
        raise outcome.disk.error()
    exit_code, sig = calls.exit_status(returncode)
    return ExecResult(
        exit_code=exit_code,
        signal=sig,
        timed_out=outcome.timed_out,
        aborted=outcome.aborted,
        stdout=out.text(),
        stderr=err.text(),
        stdout_bytes=out.total,
        stderr_bytes=err.total,
        stdout_truncated=out.truncated,
        stderr_truncated=err.truncated,
        duration_ms=round((time.monotonic() - started) * 1000, 3),
        spawn_ms=round((spawned - started) * 1000, 3),
        kill_ms=None if outcome.kill_ms is None else round(outcome.kill_ms, 3),
        backend=jail.backend,
        mount=jail.mount,
        oom_killed=oom,
        peak_memory_bytes=peak,
        network=egress.summary(egress.denials_since(mark)) if egress is not None else None,
        kernel_denials=denied,
        quarantined=quarantined or None,
    )
