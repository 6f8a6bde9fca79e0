"""A microVM's allowlist network: many TCP connections over one virtio-serial port.

A microVM has no network device. Under ``network.mode = "allowlist"`` the guest's loopback port
(:data:`sandbox.network.places.PORT`) is its only way out. This program is the guest's half: it is
started by :mod:`sandbox._jailside.vmboot` before the agent, as a uid of its own (the command's
cannot signal, trace or replace it), listens on that port and carries each accepted connection
over the ``sandbox.net`` port to the executor. The executor's half (:class:`Mux` too, in
:mod:`sandbox.backends.microvm.jail`) connects each one to the filtering proxy's unix socket. It
decides nothing: every judgement is the proxy's.

Frames, both ways: :data:`HEADER` (kind, connection, length), then ``length`` bytes for ``d``:

* ``o`` open (guest to host): a new connection; the host answers ``c`` if it cannot reach the proxy;
* ``d`` data, never more than the credit the other side has given;
* ``e`` end of data from this side: ``shutdown(SHUT_WR)`` on the other (half-close is kept);
* ``c`` closed: the connection is gone on this side, and the other closes its socket;
* ``w`` credit: ``length`` more bytes may be sent (no payload).

Each direction of each connection starts with :data:`WINDOW` bytes of credit, given back as the
receiving side writes them to its socket. So a connection whose reader is slow stops only itself,
and the port's reader never waits for a connection: it queues each frame for the connection's
writer, a queue the credit bounds. A side that sends past its credit loses that connection; a
frame that breaks the format ends the port (every connection with it).

Usage (guest): ``python3 -I -S -c "$(program('vmnet', 'netfwd'))" --port-fd N --listen
127.0.0.1:3128 [--listen [::1]:3128] [--ready-fd M]``: once bound, ``ready`` on fd ``M``; it exits
when the port ends (the VM is going).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import queue
import socket
import struct
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

HEADER = struct.Struct(">cII")
WINDOW = 256 * 1024
CHUNK = 64 * 1024  # the most one data frame carries
MAX_CONNECTIONS = 256
FLUSH_S = 5.0  # a connection the other side closed: how long what it sent before may take to be written
_END = b""  # in a writer's queue: the other side's end of data
_GONE = None  # in a writer's queue: the connection is closed


class ProtocolError(Exception):
    """The port carried something no half of this module sends."""


class Port:
    """One end of the port: whole frames out under a lock, exact reads in."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._lock = threading.Lock()

    def send(self, kind: bytes, cid: int, payload: bytes = b"", length: int | None = None) -> None:
        view = memoryview(HEADER.pack(kind, cid, len(payload) if length is None else length) + payload)
        with self._lock:
            while view:
                view = view[os.write(self.fd, view) :]

    def read(self, count: int) -> bytes | None:
        """``count`` bytes, or ``None`` when the port ends first."""
        data = bytearray()
        while len(data) < count:
            try:
                chunk = os.read(self.fd, count - len(data))
            except OSError:
                return None
            if not chunk:
                return None
            data += chunk
        return bytes(data)


class Connection:
    """One TCP connection's two directions: our socket to the port (``_outward``, which first
    connects where ``connect`` is given) and the port to our socket (``_inward``)."""

    def __init__(self, mux: Mux, cid: int, sock: socket.socket | None) -> None:
        self.mux = mux
        self.cid = cid
        self.sock = sock
        self.credit = WINDOW  # what we may still send
        self.queued = 0  # what the other side sent that our socket has not taken yet
        self.inbox: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self.cond = threading.Condition()
        self.closed = False
        self._threads = 2

    def start(self, connect: Callable[[], socket.socket] | None = None) -> None:
        threading.Thread(target=self._outward, args=(connect,), daemon=True).start()

    # -- what the port's reader hands over (never blocking)

    def received(self, data: bytes) -> None:
        with self.cond:
            self.queued += len(data)
            over = self.queued > WINDOW
        if over:  # past its credit: the other side broke the protocol
            self.close(tell=True)
        else:
            self.inbox.put(data)

    def ended(self) -> None:
        self.inbox.put(_END)

    def credited(self, count: int) -> None:
        with self.cond:
            self.credit += count
            self.cond.notify_all()

    # -- the two directions

    def _outward(self, connect: Callable[[], socket.socket] | None) -> None:
        try:
            if connect is not None:
                try:
                    sock = connect()
                except OSError:
                    self.close(tell=True)
                    return
                with self.cond:  # a close before the connect finished has nothing to shut: this does
                    if self.closed:
                        sock.close()
                        return
                    self.sock = sock
            threading.Thread(target=self._inward, daemon=True).start()
            assert self.sock is not None
            while True:
                with self.cond:
                    while self.credit <= 0 and not self.closed:
                        self.cond.wait()
                    if self.closed:
                        return
                    room = min(self.credit, CHUNK)
                data = self.sock.recv(room)
                if not data:
                    self.mux.port.send(b"e", self.cid)
                    return
                with self.cond:
                    self.credit -= len(data)
                self.mux.port.send(b"d", self.cid, data)
        except OSError:
            self.close(tell=True)
        finally:
            self._finished(2 if self.sock is None else 1)

    def _inward(self) -> None:
        assert self.sock is not None
        try:
            while (data := self.inbox.get()) is not _GONE:
                if data == _END:
                    self.sock.shutdown(socket.SHUT_WR)
                    return
                self.sock.sendall(data)
                with self.cond:
                    self.queued -= len(data)
                self.mux.port.send(b"w", self.cid, length=len(data))
            self._shut(socket.SHUT_RDWR)
        except OSError:
            self.close(tell=True)
        finally:
            self._finished(1)

    def close(self, *, tell: bool) -> None:
        """End the connection; idempotent. ``tell``: our side failed, so say ``c`` and shut our
        socket at once. Otherwise the other side said ``c`` (or the port ended): what it sent
        before is still written (a proxy's refusal, sent as it closes), within :data:`FLUSH_S`."""
        with self.cond:
            if self.closed:
                return
            self.closed = True
            self.cond.notify_all()
        self.inbox.put(_GONE)
        if tell:
            with contextlib.suppress(OSError):
                self.mux.port.send(b"c", self.cid)
            self._shut(socket.SHUT_RDWR)
            return
        self._shut(socket.SHUT_RD)  # our reader stops; the writer ends at _GONE
        timer = threading.Timer(FLUSH_S, self._shut, (socket.SHUT_RDWR,))
        timer.daemon = True
        timer.start()

    def _shut(self, how: int) -> None:
        if self.sock is not None:
            with contextlib.suppress(OSError):  # (a socket already closed: its descriptor is -1)
                self.sock.shutdown(how)

    def _finished(self, count: int) -> None:
        with self.cond:
            self._threads -= count
            last = self._threads <= 0
        if last:
            self.mux.forget(self.cid)
            if self.sock is not None:
                self.sock.close()


class Mux:
    """The connections over one port. The guest :meth:`open` s each accepted connection; the host
    gives ``connect`` (what each ``o`` frame is connected to). :meth:`serve` reads the port until
    it ends, and every connection ends with it."""

    def __init__(self, fd: int, connect: Callable[[], socket.socket] | None = None) -> None:
        self.port = Port(fd)
        self.connect = connect
        self.connections: dict[int, Connection] = {}
        self._lock = threading.Lock()
        self._next = 1
        self.ended = threading.Event()

    def open(self, sock: socket.socket) -> None:
        with self._lock:
            if len(self.connections) >= MAX_CONNECTIONS or self.ended.is_set():
                sock.close()
                return
            cid, self._next = self._next, self._next + 1
            self.connections[cid] = conn = Connection(self, cid, sock)
        try:
            self.port.send(b"o", cid)
        except OSError:
            conn.close(tell=False)
        conn.start()

    def forget(self, cid: int) -> None:
        with self._lock:
            self.connections.pop(cid, None)

    def _opened(self, cid: int) -> None:
        with self._lock:
            refused = cid in self.connections or len(self.connections) >= MAX_CONNECTIONS
            if not refused:
                self.connections[cid] = conn = Connection(self, cid, None)
        if refused:
            self.port.send(b"c", cid)
            return
        conn.start(self.connect)

    def serve(self) -> None:
        try:
            while (header := self.port.read(HEADER.size)) is not None:
                kind, cid, length = HEADER.unpack(header)
                with self._lock:
                    conn = self.connections.get(cid)
                if kind == b"d":
                    if length > CHUNK:
                        raise ProtocolError(f"a data frame of {length} bytes")
                    data = self.port.read(length)
                    if data is None:
                        return
                    if conn is not None:
                        conn.received(data)
                elif kind == b"o" and self.connect is not None:
                    self._opened(cid)
                elif kind not in (b"e", b"c", b"w"):
                    raise ProtocolError(f"a frame of kind {kind!r}")
                elif conn is None:  # a frame for a connection already gone is dropped
                    continue
                elif kind == b"e":
                    conn.ended()
                elif kind == b"w":
                    conn.credited(length)
                else:
                    conn.close(tell=False)
        except (ProtocolError, OSError):
            return
        finally:
            self.ended.set()
            with self._lock:
                left = list(self.connections.values())
            for conn in left:
                conn.close(tell=False)


def accept_into(listener: socket.socket, mux: Mux) -> None:
    while not mux.ended.is_set():
        try:
            sock, _ = listener.accept()
        except OSError:
            return
        mux.open(sock)


def main(argv: list[str] | None = None) -> None:
    from sandbox._jailside.netfwd import listeners

    parser = argparse.ArgumentParser(prog="vmnet")
    parser.add_argument("--port-fd", type=int, required=True)
    parser.add_argument("--listen", action="append", required=True)
    parser.add_argument("--ready-fd", type=int)
    args = parser.parse_args(argv)
    bound = listeners(args.listen)
    if args.ready_fd is not None:
        os.write(args.ready_fd, b"ready\n")
        os.close(args.ready_fd)
    mux = Mux(args.port_fd)
    for listener in bound:
        threading.Thread(target=accept_into, args=(listener, mux), daemon=True).start()
    mux.serve()


if __name__ == "__main__":
    main()
