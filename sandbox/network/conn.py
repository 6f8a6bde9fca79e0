"""One connection of the egress proxy while it is set up: a non-blocking socket on the event loop
and the bytes read from it but not yet used.

The proxy reads a client's handshake (and, in a tunnel, its first bytes) into :attr:`Conn.buffer`
before anything reaches the server, then passes what is buffered on first: nothing read to judge a
connection is lost. :func:`connect` opens the proxy's side toward a destination the same way.
"""

from __future__ import annotations

import errno
import os
import socket
from typing import TYPE_CHECKING

import anyio

from sandbox.network.policy import literal_address

if TYPE_CHECKING:
    from collections.abc import Callable

READ_SIZE = 64 * 1024
HANDSHAKE_TIMEOUT = 30.0
"""How long a client may take over its handshake (its request, its first bytes in a tunnel)."""


class Conn:
    """A non-blocking socket and what was read from it but not yet used (the handshake's side).

    ``on_settle`` is called once the client's request has arrived (the proxy's count of pending
    handshakes goes down)."""

    def __init__(self, sock: socket.socket, on_settle: Callable[[], None] | None = None) -> None:
        self.sock: socket.socket | None = sock
        self.buffer = bytearray()
        self.on_settle = on_settle

    def settle(self) -> None:
        """The client's request has arrived: it no longer counts as a pending handshake."""
        if self.on_settle is not None:
            self.on_settle()

    @property
    def raw(self) -> socket.socket:
        if self.sock is None:
            raise OSError(errno.EBADF, "the connection was handed to a relay")
        return self.sock

    async def fill(self) -> None:
        """Read what is there (at least one byte); ``EOFError`` when the peer has closed."""
        while True:
            try:
                data = self.raw.recv(READ_SIZE)
            except (BlockingIOError, InterruptedError):
                await anyio.wait_readable(self.raw)
                continue
            if not data:
                raise EOFError
            self.buffer += data
            return

    async def read_exact(self, size: int) -> bytes:
        while len(self.buffer) < size:
            await self.fill()
        data = bytes(self.buffer[:size])
        del self.buffer[:size]
        return data

    async def read_until(self, marker: bytes, limit: int) -> bytes:
        while (end := self.buffer.find(marker, 0, limit + len(marker))) < 0:
            if len(self.buffer) > limit:
                raise ValueError(f"no {marker!r} in the first {limit} bytes")
            await self.fill()
        return await self.read_exact(end + len(marker))

    async def copy_exact(self, sink: Conn, size: int) -> None:
        """Pass the next ``size`` bytes on to ``sink`` (what is buffered first), never more."""
        while size:
            if not self.buffer:
                await self.fill()
            chunk = bytes(self.buffer[:size])
            del self.buffer[: len(chunk)]
            size -= len(chunk)
            await sink.send_all(chunk)

    def take(self) -> bytes:
        data = bytes(self.buffer)
        self.buffer.clear()
        return data

    async def send_all(self, data: bytes | memoryview) -> None:
        view = memoryview(data)
        while view:
            try:
                view = view[self.raw.send(view) :]
            except (BlockingIOError, InterruptedError):
                await anyio.wait_writable(self.raw)

    def detach(self) -> socket.socket:
        sock = self.raw
        self.sock = None
        return sock

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


async def connect(host: str, port: int) -> Conn:
    """A TCP connection to ``host`` (an IP address) and ``port``, made without blocking the loop."""
    ip = literal_address(host)
    family = socket.AF_INET6 if ip is not None and ip.version == 6 else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setblocking(False)
        nodelay(sock)
        code = sock.connect_ex((host, port))
        if code == errno.EINPROGRESS:
            await anyio.wait_writable(sock)
            code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if code:
            raise OSError(code, os.strerror(code))
    except BaseException:
        sock.close()
        raise
    return Conn(sock)


def nodelay(sock: socket.socket) -> None:
    """``TCP_NODELAY`` on a TCP socket (a handshake's small writes go out at once); others are left alone."""
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
