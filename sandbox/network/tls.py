"""The TLS the egress proxy reads, never terminates: the server name (SNI) of a ClientHello.

In a tunnel the name must be the tunnel's host (``sni-mismatch`` otherwise); in transparent mode it
is the destination itself. The ClientHello is read whole, across records and segments, and one this
reader cannot make sense of is refused rather than let through unchecked.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sandbox.network.conn import Conn

HELLO_LIMIT = 64 * 1024
TLS_ACCESS_DENIED = b"\x15\x03\x03\x00\x02\x02\x31"
"""A fatal access_denied alert, before any ServerHello: curl and openssl print "access denied", not a bare EOF."""


class NotClientHello(Exception):
    """The bytes do not begin a TLS handshake record: not TLS, nothing to check."""


class IncompleteHello(Exception):
    """A TLS handshake has begun but the ClientHello is not complete yet."""


async def hello_sni(client: Conn) -> str | None:
    """The server name of the client's ClientHello, read whole (across records and segments).

    Raises ``NotClientHello`` when the client speaks no TLS, ``ValueError`` for a malformed one.
    """
    while True:
        if not client.buffer:
            await client.fill()
        try:
            return client_hello_sni(bytes(client.buffer))
        except IncompleteHello:
            await client.fill()


def client_hello_sni(data: bytes) -> str | None:
    """The server name a TLS ClientHello at the start of ``data`` asks for, ``None`` if it names none.

    Raises :class:`NotClientHello`, :class:`IncompleteHello`, or ``ValueError`` when it is malformed
    (a ClientHello we cannot read is refused rather than let through unchecked).
    """
    if data[:1] != b"\x16" or (len(data) > 1 and data[1] != 0x03):
        raise NotClientHello
    message = _handshake_message(data)
    if message[0] != 0x01:
        raise ValueError("the first handshake message is not a ClientHello")
    return _sni_extension(_Reader(message[4:]))


def _handshake_message(data: bytes) -> bytes:
    """The first handshake message, joined from as many handshake records as it spans."""
    payload, offset = bytearray(), 0
    while len(payload) < 4 or len(payload) < 4 + int.from_bytes(payload[1:4], "big"):
        if len(data) < offset + 5:
            raise IncompleteHello
        if data[offset] != 0x16:
            raise ValueError("the ClientHello is interrupted by another record type")
        length = int.from_bytes(data[offset + 3 : offset + 5], "big")
        if len(data) < offset + 5 + length:
            raise IncompleteHello
        payload += data[offset + 5 : offset + 5 + length]
        offset += 5 + length
        if len(payload) > HELLO_LIMIT:
            raise ValueError("the ClientHello is larger than 64 KiB")
    return bytes(payload[: 4 + int.from_bytes(payload[1:4], "big")])


def _sni_extension(hello: _Reader) -> str | None:
    hello.skip(2 + 32)  # legacy version, random
    hello.skip(hello.int(1))  # session id
    hello.skip(hello.int(2))  # cipher suites
    hello.skip(hello.int(1))  # compression methods
    if not hello.left():
        return None  # no extensions at all
    extensions = _Reader(hello.take(hello.int(2)))
    names: list[str] = []
    while extensions.left():
        kind, body = extensions.int(2), _Reader(extensions.take(extensions.int(2)))
        if kind == 0x0000:
            names.extend(_server_names(body))
    if len(names) > 1:
        raise ValueError("more than one server name")
    return names[0] if names else None


def _server_names(body: _Reader) -> list[str]:
    entries = _Reader(body.take(body.int(2)))
    names: list[str] = []
    while entries.left():
        kind, name = entries.int(1), entries.take(entries.int(2))
        if kind == 0:
            names.append(name.decode("ascii"))
    return names


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.offset = data, 0

    def left(self) -> int:
        return len(self.data) - self.offset

    def take(self, size: int) -> bytes:
        if size > self.left():
            raise ValueError("truncated ClientHello")
        chunk = self.data[self.offset : self.offset + size]
        self.offset += size
        return chunk

    def skip(self, size: int) -> None:
        self.take(size)

    def int(self, size: int) -> int:
        return int.from_bytes(self.take(size), "big")
