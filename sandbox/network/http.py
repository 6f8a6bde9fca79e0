"""HTTP/1 as the egress proxy reads it: request heads, bodies, and a conversation judged request by request.

Every request is judged, not the first (issue 31): on a plain HTTP connection each request a
client pipelines or keeps alive is parsed and must name the connection's destination; in a tunnel
whose client speaks first and not TLS, bytes that begin an HTTP request are parsed the same way,
each request's Host (or absolute URI) naming the tunnel's host, and a tunnel to port 80 must carry
HTTP. Bodies are framed by ``Content-Length`` or chunked encoding, so no request hides in one; a
head a lenient server could read differently (a bare CR or LF, a NUL, two lengths, both framings)
is refused. A request for another host ends the connection at once and is recorded as a denial
(the policy's reason, or ``host-mismatch`` for an allowed host: one destination per connection).
Plain-text protocol upgrades (WebSocket over ``ws://``) are refused in tunnels: after one, bytes
could no longer be judged.

A forwarded request asks the server for ``Connection: close``, in origin form, and says so to the
client in the response, so a client that pools its connections never sends a request on one the
server is closing.
"""

from __future__ import annotations

import contextlib
import re
import socket
import urllib.parse
from dataclasses import dataclass
from typing import TYPE_CHECKING

import anyio

from sandbox.errors import InvalidArgument
from sandbox.network.conn import HANDSHAKE_TIMEOUT
from sandbox.network.denial import Refused, where
from sandbox.network.policy import literal_address, normalize_host
from sandbox.network.relay import RELAY_CHUNK

if TYPE_CHECKING:
    from sandbox.network.conn import Conn
    from sandbox.network.denial import Denial
    from sandbox.network.policy import EgressPolicy

HEAD_LIMIT = 64 * 1024
HTTP_PORT = 80
"""A tunnel to this port must carry HTTP (judged request by request); elsewhere other protocols pass."""
HTTP_START_LIMIT = 64
"""Bytes enough to tell whether a tunnel's client begins an HTTP request line (empty lines, a method)."""
CHUNK_LINE_LIMIT = 4096
_REQUEST_START = re.compile(rb"[\r\n]*([A-Z]{0,24})")
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+\Z")
_HEX = re.compile(rb"[0-9a-fA-F]{1,16}\Z")
_STATUS = {
    "bad-request": "400 Bad Request",
    "resolve-failed": "502 Bad Gateway",
    "connect-failed": "502 Bad Gateway",
    "upstream-failed": "502 Bad Gateway",
}  # every other reason is the policy's: 403
_HOP_BY_HOP = frozenset({"connection", "proxy-connection", "keep-alive", "proxy-authorization", "te", "upgrade"})


@dataclass(frozen=True)
class HttpRequest:
    method: str
    target: str
    version: str
    headers: tuple[tuple[str, str], ...]

    @classmethod
    def parse(cls, head: bytes) -> HttpRequest:
        """One request head (ending in an empty line). Strict where servers differ: a bare CR or LF,
        a NUL, a version other than 1.0/1.1, or ambiguous body framing is refused, because a
        lenient server could read a request (and a Host) out of what this parser did not see."""
        lines = head.decode("latin-1").split("\r\n")
        if any(c in line for line in lines for c in "\r\n\0"):
            raise ValueError("a bare CR, LF or NUL in the request head")
        parts = lines[0].split(" ")
        if len(parts) != 3 or parts[2] not in ("HTTP/1.0", "HTTP/1.1") or not _TOKEN.match(parts[0]):
            raise ValueError(f"not an HTTP/1 request line: {lines[0][:80]!r}")
        request = cls(parts[0], parts[1], parts[2], tuple(_header(line) for line in lines[1:] if line))
        request.body_length()
        return request

    def body_length(self) -> int | None:
        """The body's length, ``None`` for chunked; ``ValueError`` when the framing is ambiguous (smuggling)."""
        codings = [c.strip().lower() for value in self.values("transfer-encoding") for c in value.split(",")]
        lengths = self.values("content-length")
        if codings:
            if codings != ["chunked"] or lengths:
                raise ValueError("only a chunked Transfer-Encoding, without Content-Length, is relayed")
            return None
        if not lengths:
            return 0
        if len(set(lengths)) != 1 or not (lengths[0].isascii() and lengths[0].isdigit()):
            raise ValueError(f"unusable Content-Length {lengths[:2]!r}")
        return int(lengths[0])

    def tunnelled(self, host: str) -> str:
        """The host a request inside a tunnel to ``host`` names (its URI's, its Host header's, else ``host``)."""
        if self.values("upgrade"):
            raise ValueError("a protocol upgrade is not relayed in a plain-text tunnel (use TLS)")
        hosts = self.values("host")
        if len(hosts) > 1:
            raise ValueError("more than one Host header")
        named = [split_authority(hosts[0], 0)[0]] if hosts else []
        if not self.target.startswith("/") and self.target != "*":
            named.append(_absolute_uri(self.target)[0])
        if len(set(named)) > 1:
            raise ValueError("the Host header disagrees with the URI")
        return named[0] if named else host

    def serialized(self) -> bytes:
        lines = [f"{self.method} {self.target} {self.version}", *(f"{k}: {v}" for k, v in self.headers)]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    def values(self, name: str) -> list[str]:
        return [value for key, value in self.headers if key.lower() == name]

    def destination(self) -> tuple[str, int, str]:
        """Host, port and origin-form path; the Host header must name the URI's host and port."""
        hosts = self.values("host")
        if len(hosts) > 1:
            raise ValueError("more than one Host header")
        if self.target.startswith("/"):  # origin form, as a transparent proxy sees it: Host decides
            if not hosts:
                raise ValueError("an origin-form request without a Host header")
            return (*split_authority(hosts[0], 80), self.target)
        host, port, path = _absolute_uri(self.target)
        if hosts and split_authority(hosts[0], 80) != (host, port):
            message = f"the Host header {hosts[0]!r} disagrees with the URI {self.target[:200]!r}"
            raise Refused(host, port, "host-mismatch", None, message)
        return host, port, path

    def forwarded(self, path: str) -> bytes:
        """The request for the server: origin form, no proxy headers, ``Connection: close``."""
        keep = [(k, v) for k, v in self.headers if k.lower() not in _HOP_BY_HOP]
        if not self.values("host"):
            host, port, _ = self.destination()
            keep.insert(0, ("Host", host if port == 80 else where(host, port)))
        lines = [f"{self.method} {path} {self.version}", *(f"{k}: {v}" for k, v in keep), "Connection: close"]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _header(line: str) -> tuple[str, str]:
    name, colon, value = line.partition(":")
    if not colon or not _TOKEN.match(name):
        raise ValueError(f"malformed header line {line[:80]!r}")
    return name, value.strip()


def _absolute_uri(target: str) -> tuple[str, int, str]:
    url = urllib.parse.urlsplit(target)
    if url.scheme.lower() != "http":
        raise ValueError(f"only http:// URIs are forwarded (use CONNECT for TLS), not {target[:80]!r}")
    if "@" in url.netloc or not url.hostname:
        raise ValueError(f"unusable URI authority in {target[:80]!r}")
    host, port = split_authority(url.netloc, 80)
    path = url.path or "/"
    return host, port, f"{path}?{url.query}" if url.query else path


def split_authority(authority: str, default_port: int | None) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` to a normalised host and a port."""
    if authority.startswith("["):
        host, _, rest = authority[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ("" if not rest else "x")
    else:
        host, _, port = authority.rpartition(":") if ":" in authority else (authority, "", "")
    if not port and default_port is not None:
        return normal_host(host), default_port
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"no valid port in {authority[:80]!r}")
    return normal_host(host), int(port)


def comparable(host: str) -> str:
    """``host`` as a request's Host header is compared with it (a SOCKS client's name comes as sent)."""
    try:
        return normal_host(host)
    except ValueError:
        return host


def normal_host(host: str) -> str:
    """A host name or address in the one spelling the proxy compares (``ValueError`` if it is neither)."""
    ip = literal_address(host)
    if ip is not None:
        return str(ip)
    try:
        return normalize_host(host)
    except InvalidArgument:
        raise ValueError(f"{host[:80]!r} is not a host name") from None


@dataclass(frozen=True)
class Exchange:
    """Where an HTTP conversation goes and how its requests are passed on: ``rewrite`` for a proxy
    request (origin form, ``Connection: close``), else as parsed (inside a tunnel)."""

    host: str
    port: int
    rewrite: bool

    def destination(self, request: HttpRequest) -> tuple[str, int]:
        if self.rewrite:
            host, port, _path = request.destination()
            return host, port
        return request.tunnelled(self.host), self.port

    def head(self, request: HttpRequest) -> bytes:
        return request.forwarded(request.destination()[2]) if self.rewrite else request.serialized()


async def relay_http(
    client: Conn, server: Conn, exchange: Exchange, first: HttpRequest | None, policy: EgressPolicy
) -> Denial | None:
    """Relay an HTTP/1 conversation judging *every* request the client sends, not only the first.

    The server's bytes flow back as they come; the client's are read request by request (head,
    then a body framed by ``Content-Length`` or chunked encoding), so nothing the client sends
    reaches the server unjudged. A request for another destination ends the connection at once;
    its denial is returned, to be recorded.
    """
    refused: Refused | None = None
    async with anyio.create_task_group() as tg:
        tg.start_soon(_responses, server, client, tg.cancel_scope, exchange.rewrite)
        try:
            await _requests(client, server, exchange, first, policy)
            with contextlib.suppress(OSError):
                server.raw.shutdown(socket.SHUT_WR)  # the client is done; the responses go on
        except Refused as exc:
            refused = exc
            tg.cancel_scope.cancel()
        except (OSError, EOFError, ValueError):
            tg.cancel_scope.cancel()
    return None if refused is None else refused.denial


async def _requests(
    client: Conn, server: Conn, exchange: Exchange, request: HttpRequest | None, policy: EgressPolicy
) -> None:
    while True:
        if request is None:
            try:
                head = await _read_head(client)
            except EOFError:
                return
            request = _judged(head, exchange, policy)
        await server.send_all(exchange.head(request))
        try:
            await _copy_body(client, server, request)
        except ValueError as exc:  # a body whose framing breaks midway: what follows cannot be judged
            why = f"bad request body on the connection: {exc}"
            raise Refused(exchange.host, exchange.port, "bad-request", None, why) from None
        request = None


def _judged(head: bytes, exchange: Exchange, policy: EgressPolicy) -> HttpRequest:
    """A further request on the connection, parsed; :class:`Refused` unless it goes where the first went."""
    try:
        request = HttpRequest.parse(head)
        host, port = exchange.destination(request)
    except ValueError as exc:
        why = f"bad request on the connection: {exc}"
        raise Refused(exchange.host, exchange.port, "bad-request", None, why) from None
    if (host, port) == (exchange.host, exchange.port):
        return request
    verdict = policy.decide(host, port)
    if not verdict.allowed:
        raise Refused.of(host, port, verdict)
    message = (
        f"a connection to {where(exchange.host, exchange.port)} carried a request for {where(host, port)}:"
        " one destination per connection"
    )
    raise Refused(host, port, "host-mismatch", None, message)


async def _read_head(client: Conn) -> bytes:
    """The next request head; empty lines before it are skipped, as servers do (RFC 9112, 2.2)."""
    while True:
        if not client.buffer:
            await client.fill()
        rest = client.buffer.lstrip(b"\r\n")
        del client.buffer[: len(client.buffer) - len(rest)]
        if client.buffer:
            return await client.read_until(b"\r\n\r\n", HEAD_LIMIT)


async def _copy_body(client: Conn, server: Conn, request: HttpRequest) -> None:
    length = request.body_length()
    if length is None:
        await _copy_chunked(client, server)
    else:
        await client.copy_exact(server, length)


async def _copy_chunked(client: Conn, server: Conn) -> None:
    """A chunked body, checked chunk by chunk: what follows its end is the next request head."""
    while True:
        line = await _body_line(client)
        size = line[:-2].split(b";", 1)[0].strip()
        if not _HEX.match(size):
            raise ValueError(f"bad chunk size line {line[:40]!r}")
        await server.send_all(line)
        if not int(size, 16):
            break
        await client.copy_exact(server, int(size, 16))
        if await client.read_exact(2) != b"\r\n":
            raise ValueError("a chunk does not end with CRLF")
        await server.send_all(b"\r\n")
    total = 0
    while (line := await _body_line(client)) != b"\r\n":  # the trailer section, then its empty line
        total += len(line)
        if total > HEAD_LIMIT:
            raise ValueError("the chunked trailer is too large")
        await server.send_all(line)
    await server.send_all(line)


async def _body_line(client: Conn) -> bytes:
    line = await client.read_until(b"\r\n", CHUNK_LINE_LIMIT)
    if b"\n" in line[:-2] or b"\r" in line[:-2] or b"\0" in line:
        raise ValueError("a bare CR, LF or NUL in a chunked body's line")
    return line


async def _responses(server: Conn, client: Conn, scope: anyio.CancelScope, closing: bool = False) -> None:
    """The server's bytes to the client as they come; the server's end (or an error) ends the conversation.

    ``closing`` (a forwarded request, which asked the server to close): the response's head says
    ``Connection: close`` to the client too, whatever the server wrote, or a client that pools its
    connections (npm, pip) sends its next request on this one as the server closes it (ECONNRESET)."""
    with contextlib.suppress(OSError, ValueError, EOFError):
        if closing:
            await _closing_heads(server, client)
        await client.send_all(server.take())
        buffer = bytearray(RELAY_CHUNK)  # one buffer, read into: a download costs no copy per chunk
        view, sock = memoryview(buffer), server.raw
        while True:
            try:
                size = sock.recv_into(buffer)
            except (BlockingIOError, InterruptedError):
                await anyio.wait_readable(sock)
                continue
            if not size:
                break
            await client.send_all(view[:size])
    with contextlib.suppress(OSError):
        client.raw.shutdown(socket.SHUT_WR)
    scope.cancel()


async def _closing_heads(server: Conn, client: Conn) -> None:
    """Pass the response heads on with ``Connection: close`` (interim 1xx heads, then the final one)."""
    while True:
        head = await server.read_until(b"\r\n\r\n", HEAD_LIMIT)
        lines = head[:-4].decode("latin-1").split("\r\n")
        kept = [line for line in lines[1:] if line.partition(":")[0].strip().lower() not in _HOP_BY_HOP]
        await client.send_all(("\r\n".join([lines[0], *kept, "Connection: close"]) + "\r\n\r\n").encode("latin-1"))
        if not re.match(r"HTTP/\d(?:\.\d)? 1\d\d\b", lines[0]) or lines[0].startswith("HTTP/1.1 101"):
            return


async def speaks_http(client: Conn, host: str, port: int) -> bool:
    """Whether a tunnel's client (not TLS) begins an HTTP/1 request: empty lines, then a method and a space.

    On port 80 it must: a tunnel to the plain HTTP port carries nothing else (``bad-request``).
    Elsewhere another protocol (a database's, git's) is relayed as it comes.
    """
    with anyio.fail_after(HANDSHAKE_TIMEOUT):
        while (verdict := _http_start(bytes(client.buffer))) is None:
            await client.fill()
    if not verdict and port == HTTP_PORT:
        raise Refused(host, port, "bad-request", None, f"a tunnel to {where(host, port)} must carry HTTP")
    return verdict


def _http_start(data: bytes) -> bool | None:
    """``True`` if ``data`` begins an HTTP request line, ``False`` if it cannot, ``None`` if too short to say."""
    match = _REQUEST_START.match(data)
    if match is None:  # never: every part of the pattern is optional
        return False
    if match.end() == len(data):
        return None if len(data) < HTTP_START_LIMIT else False
    return data[match.end() : match.end() + 1] == b" " and match.group(1) != b""


def http_refusal(denial: Denial) -> bytes:
    """The response that refuses a request: its status by the reason, the denial's line as its body."""
    status = _STATUS.get(denial.reason, "403 Forbidden")
    return http_response(status, {"X-Sandbox-Denial": denial.reason}, denial.line() + "\n")


def http_response(status: str, headers: dict[str, str], body: str) -> bytes:
    """A complete plain-text response that closes the connection."""
    data = body.encode()
    fields = {"Content-Type": "text/plain; charset=utf-8", **headers, "Content-Length": str(len(data))}
    lines = [f"HTTP/1.1 {status}", *(f"{k}: {v}" for k, v in fields.items()), "Connection: close"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + data
