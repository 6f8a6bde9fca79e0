"""A terminated connection's two TLS ends, read and written on a thread of their own.

:class:`TlsStream` is TLS over a blocking socket through memory BIOs (``ssl.SSLObject``), so the
bytes the proxy read before it decided to terminate (a redirected connection's ClientHello) go
in first and nothing is lost. On top of it, :class:`Reader` keeps what was read but not yet used,
as :class:`~sandbox.network.conn.Conn` does on the event loop, and reads HTTP/1 framing: a head,
a body by ``Content-Length``, chunked (:func:`read_chunked`) or to the end.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
from typing import TYPE_CHECKING

from sandbox.network.http import CHUNK_LINE_LIMIT, HEAD_LIMIT

if TYPE_CHECKING:
    from collections.abc import Iterator

READ_SIZE = 256 * 1024
TLS_RECORD = 16 * 1024
CLOSE_WAIT = 1.0
_HEX = frozenset(b"0123456789abcdefABCDEF")


class TlsSocket:
    """TLS on a blocking socket as ``ssl`` wraps it (no bytes read off it before): the fast path."""

    def __init__(self, tls: ssl.SSLSocket) -> None:
        self.tls = tls

    @classmethod
    def server(cls, sock: socket.socket, context: ssl.SSLContext) -> TlsSocket:
        return cls(context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False))

    @classmethod
    def client(cls, sock: socket.socket, context: ssl.SSLContext, host: str) -> TlsSocket:
        return cls(context.wrap_socket(sock, server_hostname=host, do_handshake_on_connect=False))

    def handshake(self) -> None:
        self.tls.do_handshake()

    def recv(self, size: int = READ_SIZE) -> bytes:
        try:
            return self.tls.recv(size)
        except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
            return b""

    def sendall(self, data: bytes | memoryview) -> None:
        self.tls.sendall(data)

    def recv_into(self, view: memoryview) -> int:
        """One TLS record's bytes (at most) into ``view``; 0 at the end."""
        try:
            return self.tls.recv_into(view)
        except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
            return 0

    def close(self) -> None:
        """Say close_notify, shut the socket down and close it (``wrap_socket`` took the descriptor over).
        The peer's own close_notify is waited for :data:`CLOSE_WAIT` at most: a jail that never says it
        holds no thread of the proxy."""
        with contextlib.suppress(ssl.SSLError, OSError, ValueError):
            self.tls.settimeout(CLOSE_WAIT)
            self.tls.unwrap()
        with contextlib.suppress(OSError):
            self.tls.shutdown(socket.SHUT_RDWR)
        self.tls.close()


def server_side(sock: socket.socket, context: ssl.SSLContext, pending: bytes) -> TlsSocket | TlsStream:
    """The jail's side of a terminated connection: through memory BIOs only when bytes were read already."""
    return TlsStream.server(sock, context, pending) if pending else TlsSocket.server(sock, context)


class TlsStream:
    """TLS on a blocking socket, through memory BIOs; ``pending`` is what was read off it already."""

    def __init__(self, sock: socket.socket, tls: ssl.SSLObject, incoming: ssl.MemoryBIO, outgoing: ssl.MemoryBIO):
        self.sock, self.tls = sock, tls
        self._incoming, self._outgoing = incoming, outgoing

    @classmethod
    def server(cls, sock: socket.socket, context: ssl.SSLContext, pending: bytes = b"") -> TlsStream:
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        incoming.write(pending)
        return cls(sock, context.wrap_bio(incoming, outgoing, server_side=True), incoming, outgoing)

    @classmethod
    def client(cls, sock: socket.socket, context: ssl.SSLContext, host: str) -> TlsStream:
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        return cls(sock, context.wrap_bio(incoming, outgoing, server_hostname=host), incoming, outgoing)

    def handshake(self) -> None:
        while True:
            try:
                self.tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                self._flush()
                self._fill()
        self._flush()

    def recv(self, size: int = READ_SIZE) -> bytes:
        """Up to ``size`` bytes; ``b""`` at the end (a close_notify or the peer's TCP end)."""
        while True:
            try:
                data = self.tls.read(size)
            except ssl.SSLWantReadError:
                self._flush()
                if not self._fill():
                    return b""
                continue
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                return b""
            self._flush()
            return data

    def sendall(self, data: bytes | memoryview) -> None:
        view = memoryview(data)
        while view:
            try:
                sent = self.tls.write(view[: 64 * TLS_RECORD])
            except ssl.SSLWantReadError:  # a renegotiation or a key update wants the peer's word first
                self._flush()
                self._fill()
                continue
            view = view[sent:]
            self._flush()

    def close(self) -> None:
        """Say close_notify when the socket still takes it, then shut the socket down."""
        with contextlib.suppress(ssl.SSLError, OSError, ValueError):
            self.tls.unwrap()
            self._flush()
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)

    def _flush(self) -> None:
        data = self._outgoing.read()
        if data:
            self.sock.sendall(data)

    def _fill(self) -> bool:
        data = self.sock.recv(READ_SIZE)
        if not data:
            self._incoming.write_eof()
            return False
        self._incoming.write(data)
        return True


class Reader:
    """A stream and what was read off it but not yet used; ``EOFError`` where more was needed."""

    def __init__(self, stream: TlsStream | TlsSocket) -> None:
        self.stream = stream
        self.buffer = bytearray()

    def fill(self) -> None:
        data = self.stream.recv()
        if not data:
            raise EOFError
        self.buffer += data

    def at_end(self) -> bool:
        """Whether the peer has ended with nothing more buffered (between requests: a clean close)."""
        if self.buffer:
            return False
        data = self.stream.recv()
        self.buffer += data
        return not data

    def read_until(self, marker: bytes, limit: int) -> bytes:
        while (end := self.buffer.find(marker, 0, limit + len(marker))) < 0:
            if len(self.buffer) > limit:
                raise ValueError(f"no {marker!r} in the first {limit} bytes")
            self.fill()
        return self.read_exact(end + len(marker))

    def read_exact(self, size: int) -> bytes:
        while len(self.buffer) < size:
            self.fill()
        data = bytes(self.buffer[:size])
        del self.buffer[:size]
        return data

    def head(self) -> bytes:
        """The next head, empty lines before it skipped (RFC 9112, 2.2)."""
        while True:
            if not self.buffer:
                self.fill()
            rest = self.buffer.lstrip(b"\r\n")
            del self.buffer[: len(self.buffer) - len(rest)]
            if self.buffer:
                return self.read_until(b"\r\n\r\n", HEAD_LIMIT)

    def pieces(self, length: int | None) -> Iterator[bytes]:
        """A body's bytes as they come: ``length`` of them, chunked (``None``) or to the end (``-1``)."""
        if length is None:
            yield from read_chunked(self)
            return
        if self.buffer:
            take = len(self.buffer) if length < 0 else min(length, len(self.buffer))
            piece = bytes(self.buffer[:take])
            del self.buffer[:take]
            length -= take if length > 0 else 0
            yield piece
        while length:  # the rest straight off the stream, no copy through the buffer
            data = self.stream.recv()
            if not data:
                if length < 0:
                    return
                raise EOFError
            if 0 < length < len(data):
                self.buffer += data[length:]
                data = data[:length]
            length -= len(data) if length > 0 else 0
            yield data


def read_chunked(reader: Reader) -> Iterator[bytes]:
    """A chunked body's data, checked chunk by chunk (extensions dropped, trailers read and dropped)."""
    while True:
        line = reader.read_until(b"\r\n", CHUNK_LINE_LIMIT)[:-2]
        size = line.split(b";", 1)[0].strip()
        if not size or len(size) > 16 or not set(size) <= _HEX or b"\r" in line or b"\n" in line or b"\0" in line:
            raise ValueError(f"bad chunk size line {line[:40]!r}")
        remaining = int(size, 16)
        if not remaining:
            break
        while remaining:
            if not reader.buffer:
                reader.fill()
            take = min(remaining, len(reader.buffer))
            piece = bytes(reader.buffer[:take])
            del reader.buffer[:take]
            remaining -= take
            yield piece
        if reader.read_exact(2) != b"\r\n":
            raise ValueError("a chunk does not end with CRLF")
    total = 0
    while (line := reader.read_until(b"\r\n", CHUNK_LINE_LIMIT)) != b"\r\n":
        total += len(line)
        if total > HEAD_LIMIT:
            raise ValueError("the chunked trailer is too large")


def chunk(data: bytes | memoryview) -> bytes:
    """``data`` as one chunk of a chunked body (empty: the last chunk, with no trailer)."""
    return b"%x\r\n%s\r\n" % (len(data), data) if data else b"0\r\n\r\n"
