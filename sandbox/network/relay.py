"""The byte relay of an egress connection once it is set up: two threads, two blocking sockets.

The sockets leave the event loop: each direction is a thread moving bytes with ``splice(2)``
through a pipe (no copy to user space; a plain copy where there is no ``splice``). The end of one
direction is passed on and the other may go on; a reset ends both. A close shuts both sockets
down, so a client never keeps an open path to a proxy that has stopped.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

RELAY_CHUNK = 1024 * 1024
RELAY_JOIN_TIMEOUT = 5.0
_HAVE_SPLICE = hasattr(os, "splice")
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)


class Relay:
    """Two threads moving bytes between two blocking sockets until both directions end."""

    def __init__(self, a: socket.socket, b: socket.socket, done: Callable[[Relay], None]) -> None:
        self._socks = (a, b)
        self._done = done
        self._lock = threading.Lock()
        self._running = 2
        self.ended = threading.Event()
        for sock in self._socks:
            sock.setblocking(True)

    def start(self) -> None:
        a, b = self._socks
        for src, dst in ((a, b), (b, a)):
            threading.Thread(target=self._pump, args=(src, dst), name="egress-relay", daemon=True).start()

    def close(self) -> None:
        """Shut both sockets down: blocked pumps return, the peers see the connection end."""
        with self._lock:
            for sock in self._socks:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            _splice_pump(src, dst) if _HAVE_SPLICE else _copy_pump(src, dst)
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)  # pass the end of one direction on; the other may go on
        except OSError:
            self.close()  # a reset on one side ends both
        finally:
            self._finish()

    def _finish(self) -> None:
        with self._lock:
            self._running -= 1
            if self._running:
                return
            for sock in self._socks:
                sock.close()
        self._done(self)
        self.ended.set()


class Relays:
    """The relays one proxy runs, each counted until both its directions end (they hold descriptors);
    and the sockets of the connections served on a thread otherwise (:meth:`hold`), shut down with them."""

    def __init__(self) -> None:
        self._relays: set[Relay] = set()
        self._held: set[tuple[int, ...]] = set()
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def hold(self, *socks: socket.socket) -> Iterator[None]:
        """While the block runs, :meth:`close` shuts ``socks`` down too (their connection's thread then
        ends). By descriptor: a TLS wrapper takes a socket's descriptor over, leaving the object empty."""
        fds = tuple(sock.fileno() for sock in socks)
        with self._lock:
            self._held.add(fds)
        try:
            yield
        finally:
            with self._lock:
                self._held.discard(fds)

    def __len__(self) -> int:
        return len(self._relays)

    def start(self, a: socket.socket, b: socket.socket) -> None:
        """Relay between ``a`` and ``b`` (now blocking, the relay's) on two threads of their own."""
        relay = Relay(a, b, self._done)
        with self._lock:
            self._relays.add(relay)
        relay.start()

    def close(self) -> list[Relay]:
        """Shut every relay's sockets down; the relays closed, to :func:`join`."""
        with self._lock:
            relays, held = list(self._relays), [fd for fds in self._held for fd in fds]
        for relay in relays:
            relay.close()
        for fd in held:
            with contextlib.suppress(OSError):
                borrowed = socket.socket(fileno=fd)
                try:
                    borrowed.shutdown(socket.SHUT_RDWR)
                finally:
                    borrowed.detach()
        return relays

    def _done(self, relay: Relay) -> None:
        with self._lock:
            self._relays.discard(relay)


def join(relays: list[Relay], timeout: float) -> None:
    """Wait (blocking) until ``relays`` have ended, at most ``timeout`` seconds in all."""
    deadline = time.monotonic() + timeout
    for relay in relays:
        relay.ended.wait(max(0.0, deadline - time.monotonic()))


def _splice_pump(src: socket.socket, dst: socket.socket) -> None:
    """Socket to pipe to socket with ``splice(2)``: the bytes never enter user space."""
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    try:
        with contextlib.suppress(OSError):
            fcntl.fcntl(write_end, _F_SETPIPE_SZ, RELAY_CHUNK)
        src_fd, dst_fd = src.fileno(), dst.fileno()
        while moved := os.splice(src_fd, write_end, RELAY_CHUNK, flags=os.SPLICE_F_MOVE):
            while moved:
                moved -= os.splice(read_end, dst_fd, moved, flags=os.SPLICE_F_MOVE)
    finally:
        os.close(read_end)
        os.close(write_end)


def _copy_pump(src: socket.socket, dst: socket.socket) -> None:
    buffer = bytearray(RELAY_CHUNK)
    view = memoryview(buffer)
    while size := src.recv_into(buffer):
        dst.sendall(view[:size])
