"""One terminated connection, served on a thread: TLS to the jail, TLS to the real server, HTTP/1.1 between.

:func:`serve` is the whole life of a connection to a host the broker terminates
(:mod:`~sandbox.network.broker`): the jail's TLS handshake with a leaf of the session's CA, the
real server's, verified, then request after request: each head judged and rewritten by the
broker before it goes on, its body passed on as it comes and searched for placeholders (one
found ends the connection before the piece that holds it is sent), its response passed back
with the secret's forms masked. HTTP/2 is never offered (ALPN says ``http/1.1``); a client that
speaks it anyway sends no HTTP/1 request line and is refused. A refusal is answered in HTTP (403
with the denial's line) and ends the connection; the server, if it saw a head already, sees the
connection end.
"""

from __future__ import annotations

import contextlib
import ssl
from itertools import chain
from typing import TYPE_CHECKING

from sandbox.network.denial import Denial, Refused
from sandbox.network.http import HEAD_LIMIT, HttpRequest, http_refusal
from sandbox.network.secrets import PLACEHOLDER_PREFIX
from sandbox.network.tlsstream import Reader, TlsSocket, TlsStream, chunk, server_side

if TYPE_CHECKING:
    import socket
    from collections.abc import Callable, Iterator

    from sandbox.network.broker import Broker, Prepared

IDLE_TIMEOUT = 600.0
"""How long either side of a terminated connection may stay silent before it is closed."""
PUSH_COMMANDS_LIMIT = 128 * 1024
COPY_BATCH = 256 * 1024
_PLACEHOLDER_SPAN = len(PLACEHOLDER_PREFIX) + 32


def serve(
    broker: Broker,
    client_sock: socket.socket,
    server_sock: socket.socket,
    host: str,
    port: int,
    pending: bytes,
    deny: Callable[[Denial], None],
) -> None:
    """Serve one terminated connection to its end (blocking); ``deny`` records each refusal."""
    for sock in (client_sock, server_sock):
        sock.settimeout(IDLE_TIMEOUT)
    client = server_side(client_sock, broker.ca.server_context(host), pending)
    server = TlsSocket.client(server_sock, broker.upstream_context, host)
    try:
        _serve(broker, client, server, host, port, deny)
    finally:
        server.close()
        client.close()


def _serve(
    broker: Broker,
    client: TlsStream | TlsSocket,
    server: TlsSocket,
    host: str,
    port: int,
    deny: Callable[[Denial], None],
) -> None:
    try:
        client.handshake()
    except (ssl.SSLError, OSError):
        return  # the jail's tool did not trust the session's CA (its own store) or went away
    try:
        server.handshake()
    except ssl.SSLCertVerificationError as exc:
        _refuse(client, Denial(host, port, "certificate-invalid", None, f"{host}: {exc.verify_message}"), deny)
        return
    except (ssl.SSLError, OSError) as exc:
        _refuse(client, Denial(host, port, "connect-failed", None, f"TLS with {host} failed: {exc}"), deny)
        return
    try:
        _Exchange(broker, client, server, host, port).run()
    except Refused as refused:
        _refuse(client, refused.denial, deny)
    except (OSError, EOFError, ValueError, ssl.SSLError):
        pass


def _refuse(client: TlsStream | TlsSocket, denial: Denial, deny: Callable[[Denial], None]) -> None:
    deny(denial)
    with contextlib.suppress(OSError, ssl.SSLError, ValueError):
        client.sendall(http_refusal(denial))


class _Exchange:
    """Requests and responses on one terminated connection, one at a time (HTTP/1.1)."""

    def __init__(self, broker: Broker, client: TlsStream | TlsSocket, server: TlsSocket, host: str, port: int) -> None:
        self.broker, self.host, self.port = broker, host, port
        self.client, self.server = client, server
        self.requests, self.responses = Reader(client), Reader(server)

    def run(self) -> None:
        while not self.requests.at_end():
            head = self.requests.head()
            try:
                request = HttpRequest.parse(head)
            except ValueError as exc:
                raise Refused(self.host, self.port, "bad-request", None, f"not an HTTP/1 request: {exc}") from None
            prepared = self.broker.prepare(request, self.host, self.port)
            self._request(prepared)
            if not self._response(prepared):
                return

    def _request(self, prepared: Prepared) -> None:
        request = prepared.request
        length = request.body_length()
        if request.version == "HTTP/1.1" and length != 0 and _expects_continue(request):
            self.client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")  # the server is not asked: its head lost Expect
        pieces = self.requests.pieces(length)
        if prepared.hash_body:
            held = _hold(
                pieces, self._body_refusal(prepared, "a request signed without X-Amz-Content-Sha256 is too large")
            )
            self.broker.sign_body(prepared, held, self.host, self.port)
            pieces = iter([held])
        elif prepared.push is not None:
            pieces = self._push_commands(prepared, pieces)
        self.server.sendall(prepared.head)
        tail = b""
        for piece in pieces:
            window = tail + piece
            secret = self.broker.misplaced_in(window)
            if secret is not None:
                raise self.broker.misplaced(prepared.request, self.host, self.port, secret, "in the request body")
            tail = window[-(_PLACEHOLDER_SPAN - 1) :]
            if piece:
                self.server.sendall(chunk(piece) if length is None else piece)
        if length is None:
            self.server.sendall(chunk(b""))

    def _push_commands(self, prepared: Prepared, pieces: Iterator[bytes]) -> Iterator[bytes]:
        """A git push's body, its ref commands judged before any of it goes on."""
        held = bytearray()
        for piece in pieces:
            held += piece
            if self.broker.judge_push(prepared, self.host, self.port, bytes(held)) is not None:
                return chain([bytes(held)], pieces)
            if len(held) > PUSH_COMMANDS_LIMIT:
                break
        raise self._body_refusal(prepared, "the push's ref commands did not arrive whole")

    def _body_refusal(self, prepared: Prepared, why: str) -> Refused:
        return self.broker.refused(prepared.request, self.host, self.port, "request-refused", None, why)

    def _response(self, prepared: Prepared) -> bool:
        """Pass the response on, masked; whether the connection may carry another request."""
        masker = Masker(prepared.masks)
        while True:
            head = self.responses.read_until(b"\r\n\r\n", HEAD_LIMIT)
            status, fields = _response_head(head)
            if 100 <= status < 200 and status != 101:
                self.client.sendall(masker.whole(head))
                continue
            break
        if status == 101:
            raise ValueError("the server switched protocols, which a terminated host may not")
        method = prepared.request.method
        length: int | None
        if method == "HEAD" or status in (204, 304):
            length = 0
        elif "chunked" in _tokens(fields, "transfer-encoding"):
            length = None
        elif "content-length" in fields:
            length = int(fields["content-length"][0])
        else:
            length = -1
        self.client.sendall(masker.whole(head))
        if length is not None and length > 0 and not masker.masks:
            self._copy_body(length)
            length = 0
        for piece in self.responses.pieces(length):
            out = masker.feed(piece)
            if out:
                self.client.sendall(chunk(out) if length is None else out)
        rest = masker.flush()
        if rest:
            self.client.sendall(chunk(rest) if length is None else rest)
        if length is None:
            self.client.sendall(chunk(b""))
        closing = "close" in _tokens(fields, "connection") or "close" in _request_tokens(prepared.request)
        return length != -1 and not closing and head.startswith(b"HTTP/1.1")

    def _copy_body(self, length: int) -> None:
        """``length`` bytes of a response with nothing to mask, passed on in batches: the server's
        TLS records (16 KiB each) are gathered into one buffer before they are encrypted again, so
        a large download costs a few calls per megabyte, not two per record."""
        buffered = self.responses.buffer
        if buffered:
            take = min(length, len(buffered))
            self.client.sendall(bytes(buffered[:take]))
            del buffered[:take]
            length -= take
        buffer = bytearray(COPY_BATCH)
        view = memoryview(buffer)
        while length:
            want = min(length, COPY_BATCH)
            filled = 0
            while filled < want:
                got = self.server.recv_into(view[filled:want])
                if not got:
                    raise EOFError
                filled += got
            self.client.sendall(view[:filled])
            length -= filled


class Masker:
    """Replaces the given byte strings with as many ``*`` in a stream, across the pieces it comes in."""

    def __init__(self, masks: list[bytes]) -> None:
        self.masks = sorted({mask for mask in masks if mask}, key=len, reverse=True)
        self.keep = max((len(mask) for mask in self.masks), default=1) - 1
        self.tail = b""

    def whole(self, data: bytes) -> bytes:
        for mask in self.masks:
            data = data.replace(mask, b"*" * len(mask))
        return data

    def feed(self, data: bytes) -> bytes | memoryview:
        """What of ``tail + data`` can go on now: all but the last bytes a mask could still begin in."""
        if not self.masks:
            return data
        joined = self.tail + data
        if any(mask in joined for mask in self.masks):  # the usual answer is no: nothing copied again
            joined = self.whole(joined)
        cut = max(0, len(joined) - self.keep)
        self.tail = joined[cut:]
        return memoryview(joined)[:cut]

    def flush(self) -> bytes:
        rest, self.tail = self.tail, b""
        return rest


def _hold(pieces: Iterator[bytes], too_large: Refused) -> bytes:
    from sandbox.network.broker import MAX_SIGNED_BODY

    held = bytearray()
    for piece in pieces:
        held += piece
        if len(held) > MAX_SIGNED_BODY:
            raise too_large
    return bytes(held)


def _response_head(head: bytes) -> tuple[int, dict[str, list[str]]]:
    lines = head[:-4].decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit() or len(parts[1]) != 3:
        raise ValueError(f"not an HTTP/1 status line: {lines[0][:80]!r}")
    fields: dict[str, list[str]] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon:
            raise ValueError(f"malformed response header {line[:80]!r}")
        fields.setdefault(name.strip().lower(), []).append(value.strip())
    lengths = set(fields.get("content-length", []))
    if len(lengths) > 1 or (lengths and not next(iter(lengths)).isdigit()):
        raise ValueError("an unusable Content-Length in the response")
    return int(parts[1]), fields


def _tokens(fields: dict[str, list[str]], name: str) -> set[str]:
    return {token.strip().lower() for value in fields.get(name, []) for token in value.split(",")}


def _request_tokens(request: HttpRequest) -> set[str]:
    tokens = {token.strip().lower() for value in request.values("connection") for token in value.split(",")}
    return tokens if request.version == "HTTP/1.1" or "keep-alive" in tokens else tokens | {"close"}


def _expects_continue(request: HttpRequest) -> bool:
    return any(value.strip().lower() == "100-continue" for value in request.values("expect"))
