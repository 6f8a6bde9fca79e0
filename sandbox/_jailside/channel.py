"""The agent's end of its link to the executor: where its requests come from and its frames go.

Apart from :mod:`sandbox._jailside.agent` because this is the transport, not the calls: the
agent serves the same requests, one protocol, whichever of three channels carries them. Its
loop's selector lives here too, since the channel is what it mostly waits on.

**Socket** (a local engine): ``<socket>`` names a unix socket the executor listens on, in a host
directory bound read-only into the container; the agent connects to it before anything else
runs (:func:`connect`), says ``s`` ``socket`` on stdout (:func:`say`), and from then on reads
its requests from that socket and writes its replies to it. Each ``run`` request arrives with
the call's pipe ends as ``SCM_RIGHTS``: stdout's and stderr's write ends (and stdin's read end
when the call has stdin), which the command gets as its fds 1, 2 (and 0) and the agent closes at
once: the command writes straight into the executor's pipes, no byte of output passes through
the agent or through dockerd. **Attach** (the fallback: a remote engine, a socket that cannot be
reached, ``<socket>`` empty): the agent says ``s`` ``attach: <why>`` (when a socket was named)
and the requests come on stdin, the command's output goes back on stdout in frames.

**Inherited socket** (bubblewrap: ``<socket>`` is ``fd:N``): one end of a socketpair the executor
made before starting ``bwrap --as-pid-1``, so there is no path to connect to nor any peer to
check. The agent says ``s`` ``socket`` on the socket itself (its stdin is not watched).

Requests are JSON lines, one per line; replies are binary frames, :data:`HEADER` then the
payload. End of stdin or of the socket (the executor detached or died) kills everything and
ends the container (:meth:`Channel.shutdown`).
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import socket
import struct
import sys

TYPE_CHECKING = False  # typing's import costs each jail's start about 3 ms: annotations need none
if TYPE_CHECKING:
    from typing import Any, NoReturn

HEADER = struct.Struct(">cII")  # kind, call id, payload length
READ_SIZE = 1 << 16
CONNECT_S = 5.0
MAX_FDS = 4  # stdout, stderr, stdin, the hold socket (bubblewrap)


class Channel:
    """Requests in, frames out, and the selector the agent's loop waits on.

    :meth:`request` is the agent's: each complete request line read is handed to it.
    """

    def __init__(self, sock: socket.socket | None = None, *, watch_stdin: bool = True) -> None:
        self.sock = sock  # the executor's socket, or None: requests on stdin, replies on stdout
        self.out_fd = sock.fileno() if sock is not None else 1
        self.fds: list[int] = []  # pipe ends received with requests, oldest first
        self.sel = selectors.DefaultSelector()
        self.inbuf = b""
        self.out = bytearray()
        self.writing = False
        wake_r, wake_w = os.pipe()
        for fd in (0, 1, wake_r, wake_w):
            os.set_blocking(fd, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        self.wake = wake_r
        # stdin: the requests in attach mode; in socket mode only its end matters (we are detached).
        if watch_stdin:
            self.sel.register(0, selectors.EVENT_READ, "in")
        self.sel.register(wake_r, selectors.EVENT_READ, "wake")
        if sock is not None:
            sock.setblocking(False)
            self.sel.register(sock.fileno(), selectors.EVENT_READ, "sock")

    def request(self, line: bytes) -> None:
        """Serve one request line: the agent's part."""
        raise NotImplementedError

    # -- output to the executor

    def emit(self, kind: bytes, cid: int, payload: bytes) -> None:
        self.out += HEADER.pack(kind, cid, len(payload))
        self.out += payload

    def flush(self) -> None:
        while self.out:
            try:
                sent = os.write(self.out_fd, self.out)
            except BlockingIOError:
                break
            except OSError:  # the executor is gone
                self.shutdown()
            del self.out[:sent]
        want = bool(self.out)
        if want != self.writing:
            if self.sock is not None:  # one fd, read and written: change its events
                events = selectors.EVENT_READ | (selectors.EVENT_WRITE if want else 0)
                self.sel.modify(self.out_fd, events, "sock")
            elif want:
                self.sel.register(1, selectors.EVENT_WRITE, "out")
            else:
                self.sel.unregister(1)
            self.writing = want

    # -- requests from the executor

    def received(self, msg: dict[str, Any]) -> list[int]:
        """The fds that came with this request (socket mode), oldest first."""
        count = int(msg.get("fds", 0)) if self.sock is not None else 0
        fds, self.fds = self.fds[:count], self.fds[count:]
        return fds

    def read_requests(self) -> None:
        try:
            data = os.read(0, READ_SIZE)
        except BlockingIOError:
            return
        if not data:
            self.shutdown()
        if self.sock is None:
            self.take(data)

    def read_socket(self) -> None:
        assert self.sock is not None
        try:
            data, fds, _flags, _addr = socket.recv_fds(self.sock, READ_SIZE, MAX_FDS)
        except BlockingIOError:
            return
        except OSError:
            data, fds = b"", []
        # The kernel ends a read at a message that carries fds: they come with its first byte,
        # so they are here before the request line they belong to is complete.
        self.fds += fds
        if not data:
            self.shutdown()
        self.take(data)

    def take(self, data: bytes) -> None:
        self.inbuf += data
        *lines, self.inbuf = self.inbuf.split(b"\n")
        for line in lines:
            if line.strip():
                self.request(line)

    def shutdown(self) -> NoReturn:
        with contextlib.suppress(ProcessLookupError):
            os.kill(-1, signal.SIGKILL)
        sys.exit(0)


def connect(path: str) -> tuple[socket.socket | None, str]:
    """The executor's socket, connected before any command runs; else why not (attach mode)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(CONNECT_S)
    try:
        sock.connect(path)
    except OSError as exc:
        sock.close()
        return None, f"attach: cannot connect to {path}: {exc.strerror or exc}"
    return sock, "socket"


def say(kind: bytes, payload: bytes) -> None:
    """One frame on stdout, blocking (before the loop: the executor reads the attach stream)."""
    data = HEADER.pack(kind, 0, len(payload)) + payload
    while data:
        data = data[os.write(1, data) :]
