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
import os
import signal as signal_module
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import anyio
from pydantic import BaseModel

from sandbox.errors import InvalidArgument, SandboxError

if TYPE_CHECKING:
    from anyio.abc import ByteReceiveStream

    from sandbox.backends.base import Jail, Process, Stdin
    from sandbox.profile import Profile

OutputCallback = Callable[[bytes], Awaitable[None] | None]
MIN_TIMEOUT_S = 1.0
READ_SIZE = 1 << 16


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
        tail = tail[-self.tail_limit:]
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


# Runs in the jail, as the command's parent-to-be: the jail's own view decides 127 (not found) or
# 126 (found, not executable), and `exec` still gives those statuses when a check passes and the
# exec fails anyway (a script's missing interpreter). dash adds PWD to the environment; we don't.
# $1 is a host-side explanation appended to the one line, for links into what the jail hides.
_CHECKED = """h=$1; shift; unset PWD
case $1 in
*/*) if [ ! -e "$1" ]; then w="not found in the jail"; c=127
     elif [ -d "$1" ]; then w="is a directory, not a command"; c=126
     elif [ ! -x "$1" ]; then w="cannot be executed (no execute permission)"; c=126; fi ;;
*) command -v -- "$1" >/dev/null 2>&1 || { w="command not found in the jail"; c=127; } ;;
esac
[ -z "$c" ] || { printf 'sandbox: %s: %s%s\\n' "$1" "$w" "$h" >&2; exit "$c"; }
exec "$@"
"""


def checked_argv(jail: Jail, argv: Sequence[str], cwd: str | None = None) -> list[str]:
    """``argv`` run so that a missing command exits 127 and an unexecutable one 126, on every
    backend, with one line on stderr naming it (and, where a host-side look finds it, that it
    resolves into a part of the host the jail does not show)."""
    hint = _hidden_hint(jail, argv[0], cwd or str(jail.workspace))
    return ["/bin/sh", "-c", _CHECKED, "sandbox", hint, *argv]


def _under(path: str, roots: Sequence[str]) -> bool:
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


def _candidate(jail: Jail, name: str, cwd: str) -> str | None:
    """Where the jail would look for ``name``, if that is inside the workspace (else we cannot tell)."""
    if "/" in name:
        path = os.path.normpath(os.path.join(cwd, name))
        return path if _under(path, (str(jail.workspace),)) else None
    from sandbox.backends.environment import base_env

    # The workspace's own tool directories (.venv/bin ...) come first on the jail's PATH.
    for folder in base_env(jail.profile, workspace=jail.workspace).get("PATH", "").split(":"):
        path = os.path.normpath(os.path.join(cwd, folder, name))
        if _under(path, (str(jail.workspace),)) and os.path.lexists(path):
            return path
    return None


def _hidden_hint(jail: Jail, name: str, cwd: str) -> str:
    path = _candidate(jail, name, cwd)
    if path is None:
        return ""
    shown = jail.host_paths_shown
    for _ in range(40):  # the kernel's own limit on links followed
        parent = os.path.realpath(os.path.dirname(path))
        path = os.path.join(parent, os.path.basename(path))
        if not _under(parent, shown):
            break
        if not os.path.islink(path):
            return ""
        path = os.path.normpath(os.path.join(parent, os.readlink(path)))
        if not _under(path, shown):
            break
    else:
        return ""
    there = "exists" if os.path.exists(path) else "does not exist either"
    return f" (it resolves to {path}, which the jail does not show; on the host it {there})"


def check_timeout(timeout: float | None, profile: Profile) -> float:
    """The effective timeout: the profile's default, or an override from 1 s to its ``timeouts.max_s``."""
    if timeout is None:
        return float(profile.timeouts.default_s)
    ceiling = profile.timeouts.max_s
    if isinstance(timeout, bool) or not MIN_TIMEOUT_S <= timeout <= ceiling:
        raise InvalidArgument(
            f"timeout must be between {MIN_TIMEOUT_S:g} and {ceiling:g} seconds, got {timeout!r} "
            f"(the ceiling is profile {profile.name!r}'s timeouts.max_s)",
            timeout=timeout, max_s=ceiling, profile=profile.name,
        )
    return float(timeout)


async def _pump(stream: ByteReceiveStream, capture: Capture, callback: OutputCallback | None) -> None:
    async for chunk in stream:
        capture.feed(chunk)
        if callback is not None:
            maybe = callback(chunk)
            if inspect.isawaitable(maybe):
                await maybe


async def _feed(proc: Process, scope: anyio.CancelScope) -> None:
    with scope:
        await proc.feed_stdin()


class _Outcome:
    timed_out = False
    aborted = False
    kill_ms: float | None = None


async def _supervise(proc: Process, limit: float, abort: anyio.Event | None, grace: float) -> _Outcome:
    outcome = _Outcome()
    async with anyio.create_task_group() as tg:

        async def watch_abort() -> None:
            assert abort is not None
            await abort.wait()
            outcome.aborted = True
            tg.cancel_scope.cancel()

        if abort is not None:
            tg.start_soon(watch_abort)
        with anyio.move_on_after(limit) as deadline:
            await proc.wait()
        outcome.timed_out = deadline.cancelled_caught
        tg.cancel_scope.cancel()
    stop = time.monotonic()
    # Leftovers of a normal exit get no grace: the call is over, nothing may outlive it.
    await proc.kill_tree(grace if outcome.timed_out or outcome.aborted else 0)
    if outcome.timed_out or outcome.aborted:
        outcome.kill_ms = (time.monotonic() - stop) * 1000
    return outcome


def _lone_error(exc: BaseException) -> SandboxError | None:
    """The one SandboxError a task group wrapped (a backend failing mid-call), if that is all it holds."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc if isinstance(exc, SandboxError) else None


def _status(returncode: int) -> tuple[int, int | None]:
    if returncode < 0:
        return 128 - returncode, -returncode
    if returncode > 128 and returncode - 128 < signal_module.NSIG:
        return returncode, returncode - 128
    return returncode, None


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
) -> ExecResult:
    """Run ``argv`` in ``jail``; see the module docstring for the guarantees.

    ``capture_bytes`` overrides the profile's per-stream capture (for machine-read output).
    """
    profile = jail.profile
    limit = check_timeout(timeout, profile)
    grace = profile.timeouts.kill_grace_s
    keep = capture_bytes or profile.limits.capture_bytes
    out, err = Capture(keep), Capture(keep)
    started = time.monotonic()
    proc = await jail.spawn(list(argv), env=env, cwd=cwd, stdin=stdin)
    spawned = time.monotonic()
    try:
        async with anyio.create_task_group() as tg:
            feeding = anyio.CancelScope()
            if stdin is not None:
                tg.start_soon(_feed, proc, feeding)
            tg.start_soon(_pump, proc.stdout, out, on_stdout)
            tg.start_soon(_pump, proc.stderr, err, on_stderr)
            outcome = await _supervise(proc, limit, abort, grace)
            # A streamed stdin may never end (`yes | sandbox run -- head -1`): the call is over.
            feeding.cancel()
        returncode = await proc.wait()
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
    exit_code, sig = _status(returncode)
    return ExecResult(
        exit_code=exit_code, signal=sig, timed_out=outcome.timed_out, aborted=outcome.aborted,
        stdout=out.text(), stderr=err.text(), stdout_bytes=out.total, stderr_bytes=err.total,
        stdout_truncated=out.truncated, stderr_truncated=err.truncated,
        duration_ms=round((time.monotonic() - started) * 1000, 3),
        spawn_ms=round((spawned - started) * 1000, 3),
        kill_ms=None if outcome.kill_ms is None else round(outcome.kill_ms, 3),
        backend=jail.backend, mount=jail.mount, oom_killed=oom, peak_memory_bytes=peak,
    )
