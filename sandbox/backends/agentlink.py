"""The host's side of a warm jail's agent (:mod:`sandbox._jailside.agent`), shared by every backend.

* :class:`Link`: calls by id, the agent's frames (``HEADER`` then payload) parsed and routed to
  their call from a reader thread, the end of the link told to every call in flight.
* :class:`FdLink`: a connected unix socket to the agent, requests as JSON lines, each ``run``
  with its call's pipe ends as ``SCM_RIGHTS`` (:func:`socket.send_fds`). Docker's agent connects
  to a socket of ours (:mod:`sandbox.backends.docker.links` checks its peer); bubblewrap's gets
  one end of a socketpair as an inherited fd (:mod:`sandbox.backends.bwrap_warm`).
* :class:`CallPipes`: one call's stdout/stderr (and stdin) pipes: the command's ends go to the
  agent, ours are read like a local child's (:class:`~sandbox.backends.child.FdReceiveStream`),
  so no byte of output crosses the agent.
* :func:`run_request`: a call's ``run`` request, the same for every backend. The file tools'
  runner (spawned with ``runner=True``, :meth:`sandbox.backends.base.Jail.spawn`) is the one the
  agent carries (``"py": "runner"``), and a small request of it rides the message for the agent to
  serve itself (``"inline"``).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import anyio
import anyio.from_thread
import anyio.lowlevel

from sandbox import _jailside, jsonbound
from sandbox._jailside.channel import HEADER as AGENT_HEADER
from sandbox._jailside.runner import INLINE_BYTES
from sandbox.backends.child import FdReceiveStream, feed_fd
from sandbox.backends.environment import base_env

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from pathlib import Path

    from sandbox.backends.base import Stdin
    from sandbox.profile import Profile


# The agent's program carries its own modules (those it imports come first) and the file tools'
# runner (and its glob translator), defined once at the jail's start: a Read, Write or LS is then
# served by the agent, no Python start-up per call.
AGENT_MODULES = ("agent", "channel", "census", "forked", "hardening", "runner", "glob")  # main first
AGENT_PROGRAM = _jailside.program(*AGENT_MODULES)
INLINE_REQUEST_BYTES = 64 * 1024  # a larger file tool request (a Write's content) goes to a forked runner
# The most an inline Edit can write: a file the agent may hold, grown by a request's worth.
INLINE_WRITE_BYTES = INLINE_BYTES + INLINE_REQUEST_BYTES


def run_request(
    profile: Profile,
    workspace: Path,
    argv: Sequence[str],
    env: Mapping[str, str] | None,
    cwd: str | None,
    stdin: Stdin,
    *,
    runner: bool,
    inline: bool,
) -> tuple[dict[str, Any], bool]:
    """A call's ``run`` request (its ``id`` and ``fds`` are the caller's), and whether it rides inline.

    ``runner``: ``argv`` is the file tools' runner, which the agent runs as its own (it takes the
    call's pipes: socket mode; over the attach stream the caller passes ``False``). ``inline``:
    it may also serve a small request in its own process. Inline, the runner's request (``stdin``)
    is in the message and the call has no stdin pipe: the agent serves it, or declines
    (:func:`sandbox._jailside.runner.serve_inline`) and gives the forked runner a copy of it as
    stdin. The agent has none of a call's rlimits, so under a ``file_size`` limit smaller than
    what it could write, never inline.
    """
    request: dict[str, Any] = {
        "op": "run",
        "argv": list(argv),
        "env": base_env(profile, env, workspace=workspace),
        "cwd": cwd or str(workspace),
        "stdin": stdin is not None,
    }
    if not runner:
        return request, False
    request["py"], request["argv"] = "runner", ["sandbox-runner"]
    file_size = profile.limits.file_size
    if not inline or (file_size is not None and file_size < INLINE_WRITE_BYTES):
        return request, False
    if not isinstance(stdin, bytes) or len(stdin) > INLINE_REQUEST_BYTES or not stdin.isascii():
        return request, False  # json.dumps' output is ASCII: anything else is not a request of ours
    request["inline"], request["stdin"] = stdin.decode("ascii"), False
    return request, True


MAX_FRAME = 1 << 22  # the agent's frames are a read's worth of output (64 KiB) or a short report
REPORT_BYTES = 1 << 16


class FrameError(OSError):
    """The agent sent what it never sends: the link is ended (its readers end on an ``OSError``)."""


def _report(payload: bytes) -> dict[str, Any]:
    """An exit report; one that is not a small, shallow JSON object reads as empty (no exit status)."""
    try:
        report = jsonbound.loads(payload, max_bytes=REPORT_BYTES, max_depth=4)
    except ValueError:
        return {}
    return report if isinstance(report, dict) else {}


class LinkedCall(Protocol):
    """What a link routes to: a call's frames, and the news that the agent is gone."""

    def frame(self, kind: bytes, payload: bytes) -> None: ...

    def lost(self) -> None: ...


class Link(ABC):
    """What every link shares: calls by id, the agent's frames parsed and routed, death told to the calls."""

    stream: ClassVar[str]

    def __init__(self) -> None:
        self.calls: dict[int, Any] = {}  # id -> LinkedCall (the backend's own call class)
        self.dead = False
        self.retired = False
        self.error: BaseException | None = None
        self._lock = threading.Lock()
        self._ids = iter(range(1, 1 << 31))
        self._token = anyio.lowlevel.current_token()

    def next_id(self) -> int:
        return next(self._ids)

    def register(self, cid: int, call: Any) -> bool:
        """Route the frames of ``cid`` to ``call``; ``False`` when the link has already ended. Its
        calls were told then (:meth:`ended`), so this one never will be: the caller ends it as lost.
        Under the lock, a call is either in the copy :meth:`ended` tells or sees the end here."""
        with self._lock:
            self.calls[cid] = call
            return not self.dead

    @property
    @abstractmethod
    def diagnostics(self) -> bytes:
        """The tail of the agent's stderr."""

    @abstractmethod
    def send(self, message: dict[str, Any], fds: Sequence[int] = ()) -> None:
        """Write one request (blocking: call from a worker thread)."""

    @abstractmethod
    def close(self) -> None:
        """Drop the link (the reader thread ends, the agent sees the end and stops)."""

    def _parse(self, buffer: bytearray) -> None:
        """Route the whole frames in ``buffer``; :class:`FrameError` for one longer than any the
        agent sends (a tampered agent's length would hold the reader's memory without bound)."""
        size = AGENT_HEADER.size
        while len(buffer) >= size:
            kind, cid, length = AGENT_HEADER.unpack_from(buffer)
            if length > MAX_FRAME:
                raise FrameError(f"a frame of {length} bytes from the agent, more than {MAX_FRAME}")
            if len(buffer) < size + length:
                return
            payload = bytes(buffer[size : size + length])
            del buffer[: size + length]
            if cid == 0:
                self._said(kind, payload)
                continue
            proc = self.calls.get(cid)
            if proc is not None:
                proc.frame(kind, payload)

    def _said(self, kind: bytes, payload: bytes) -> None:  # noqa: B027 - only some links have them
        """A frame of the agent's own (call id 0)."""

    def ended(self, error: BaseException | None = None) -> None:
        """The link is gone: every call in flight is lost (from a reader thread)."""
        with self._lock:
            if self.dead:
                return
            self.dead = True
            self.error = error
        for proc in self.calls.copy().values():  # copy(): atomic, the loop may forget one meanwhile
            with contextlib.suppress(RuntimeError):  # the event loop is gone
                anyio.from_thread.run_sync(proc.lost, token=self._token)

    @staticmethod
    def line(message: dict[str, Any]) -> bytes:
        return json.dumps(message, separators=(",", ":")).encode() + b"\n"


class FdLink(Link):
    """A connected unix socket to the agent: requests with pipe ends, replies as frames."""

    stream = "socket"

    def __init__(self, sock: socket.socket, name: str) -> None:
        super().__init__()
        sock.setblocking(True)  # the reader thread waits in recv(); close() unblocks it
        self.sock = sock
        self.hello = threading.Event()  # the agent's ``s`` frame (bubblewrap's agent says it here)
        threading.Thread(target=self._run, name=name, daemon=True).start()

    @property
    def diagnostics(self) -> bytes:
        return b""

    def send(self, message: dict[str, Any], fds: Sequence[int] = ()) -> None:
        data = self.line(message)
        with self._lock:
            # The fds ride with the request's first bytes; the agent holds them until its line is whole.
            sent = socket.send_fds(self.sock, [data], list(fds)) if fds else 0
            self.sock.sendall(data[sent:])

    def _said(self, kind: bytes, payload: bytes) -> None:  # noqa: ARG002 - the word itself says nothing more
        if kind == b"s":
            self.hello.set()

    def _run(self) -> None:
        buffer = bytearray()
        error: BaseException | None = None
        try:
            while data := self.sock.recv(1 << 16):
                buffer += data
                self._parse(buffer)
        except OSError as exc:
            error = exc
        finally:
            self.hello.set()
            self.ended(error)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


class AgentReplies:
    """A call's half of the agent's replies, shared by the backends' call classes.

    :meth:`frame` runs in the link's reader thread and hands each reply to the event loop:
    ``x`` (the exit report) to ``_exit``, ``!`` (a refusal) to ``_end`` after noting it, and
    anything else (output and credit frames, attach stream only) to ``_output``.
    """

    _token: Any
    _refused: str | None

    def frame(self, kind: bytes, payload: bytes) -> None:
        with contextlib.suppress(RuntimeError):  # the event loop is gone
            if kind == b"x":
                anyio.from_thread.run_sync(self._exit, _report(payload), token=self._token)
            elif kind == b"!":
                self._refused = payload.decode(errors="replace")
                anyio.from_thread.run_sync(self._end, token=self._token)
            else:
                self._output(kind, payload)

    def _output(self, kind: bytes, payload: bytes) -> None:
        """An output or credit frame (attach stream only)."""

    @abstractmethod
    def _exit(self, result: dict[str, Any]) -> None:
        """The agent's exit report."""

    @abstractmethod
    def _end(self) -> None:
        """The call is over (reported, refused or lost)."""


class CallPipes:
    """One call's pipes: ``theirs`` go to the agent with the run request, ``stdout``/``stderr`` are ours."""

    def __init__(self, stdin: Stdin) -> None:
        ours: list[int] = []
        theirs: list[int] = []
        self._stdin_fd: int | None = None
        with contextlib.ExitStack() as cleanup_on_fail:
            for wanted in (True, True, stdin is not None):
                if not wanted:
                    continue
                read, write = os.pipe()
                cleanup_on_fail.callback(os.close, read)
                cleanup_on_fail.callback(os.close, write)
                ours.append(read)
                theirs.append(write)
            cleanup_on_fail.pop_all()
        if stdin is not None:  # the command reads stdin's read end; we write
            self._stdin_fd, theirs[2] = theirs[2], ours.pop()
            os.set_blocking(self._stdin_fd, False)
        self._stdin = stdin
        self.theirs = theirs
        self.stdout, self.stderr = FdReceiveStream(ours[0]), FdReceiveStream(ours[1])

    def handed_over(self) -> None:
        """The run request is sent (or failed): drop our copies of the command's ends."""
        theirs, self.theirs = self.theirs, []
        for fd in theirs:
            os.close(fd)

    async def feed_stdin(self) -> None:
        fd = self._stdin_fd
        if fd is None:
            return
        try:
            await feed_fd(fd, self._stdin or b"")
        finally:
            self._close_stdin()

    def _close_stdin(self) -> None:
        fd, self._stdin_fd = self._stdin_fd, None
        if fd is not None:
            os.close(fd)

    def close(self) -> None:
        self.handed_over()  # a request that never went out
        self.stdout.close()
        self.stderr.close()
        self._close_stdin()
