"""The host-side egress proxy: HTTP CONNECT, plain HTTP and SOCKS5, filtered by an :class:`EgressPolicy`.

The jail reaches it only through a unix socket (a forwarder inside listens on the jail's loopback);
tests and a later transparent mode may also use a loopback TCP address. The protocol is told by the
first byte: ``0x05`` is SOCKS5 (no authentication, CONNECT only, names resolved here), anything
else is read as HTTP: ``CONNECT host:port`` opens a tunnel, any other method is forwarded
(``Connection: close`` asked of the server, in origin form, and said to the client in the response,
so a client that pools its connections never sends a request on one the server is closing).

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

Every connection goes the same way: the policy judges the name and port; a name the policy does
not know is put to the approver when the policy asks (no approver, an error or the timeout deny);
the proxy resolves the name itself and checks *every* address (a name that resolves to loopback,
a private network or the metadata service is refused unless that address is allowed: no DNS
rebinding), then connects to an address it checked, never re-resolving. In a tunnel it reads the
client's first bytes before any reach the server: a TLS ClientHello whose SNI names another host
is refused (``sni-mismatch``); TLS is never terminated. With an ``upstream`` proxy the name is
judged the same but the upstream resolves it and connects: the address check is then the
upstream's (its own, usually private, address is not checked).

Transparent mode adds two TCP listeners for connections a jail's DNAT rules redirected here, which
carry no proxy protocol: on the HTTP one an ordinary request whose Host header names the
destination (its port, else 80), forwarded as above; on the TLS one a ClientHello whose SNI names
the destination, on port 443 (no SNI, no destination: refused). They bind with ``IP_FREEBIND``,
so their address (the host's end of a veth pair) need not exist yet.

Once a connection is set up the two sockets leave the event loop for two relay threads, which
move bytes with ``splice(2)`` through a pipe (no copy to user space); a close shuts both sockets
down, so a client never keeps an open path to a proxy that has stopped. Plain HTTP (judged request
by request) stays on the event loop instead.

One proxy serves one session, in a process every session shares (``sandbox serve``): it holds at
most :data:`MAX_CONNECTIONS` connections and :data:`MAX_HANDSHAKES` whose request is overdue
(slowloris: silent for :data:`HANDSHAKE_STALL_S`; a burst of fresh connections is not one); past
either a connection gets a refusal in its protocol (503, a SOCKS failure, a TLS alert) and an
``over-limit`` denial, so one session's flood runs into its own cap, not the process's descriptors.
``accept`` failing (EMFILE) pauses that listener briefly, never the loop.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import fcntl
import inspect
import logging
import os
import re
import socket
import threading
import time
import urllib.parse
from collections import defaultdict
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Self, TypeVar

import anyio
import anyio.from_thread
import anyio.to_thread

from sandbox.errors import BackendUnavailable, InvalidArgument, map_errors
from sandbox.network.policy import (
    EgressPolicy,
    IPAddress,
    Verdict,
    literal_address,
    normalize_host,
)
from sandbox.network.resolve import SystemResolver
from sandbox.vocabulary import Answer, DenialReason, ProxyProtocol

if TYPE_CHECKING:
    from collections.abc import Mapping
    from contextlib import AbstractAsyncContextManager
    from types import TracebackType

    from anyio.abc import TaskGroup, TaskStatus
    from anyio.from_thread import BlockingPortal

    from sandbox.network.resolve import Resolver

log = logging.getLogger(__name__)


HEAD_LIMIT = 64 * 1024
HELLO_LIMIT = 64 * 1024
READ_SIZE = 64 * 1024
RELAY_CHUNK = 1024 * 1024
HANDSHAKE_TIMEOUT = 30.0
MAX_CONNECTIONS = 128
"""Connections one proxy (one session's) holds at once, being set up or relayed: each costs descriptors
(two sockets, a pipe per relayed direction) of a process every session of ``sandbox serve`` shares."""
QUEUE_WAIT = 10.0
"""How long a connection past :data:`MAX_CONNECTIONS` waits in the listener's backlog (not accepted:
it costs this process no descriptor) for a place before it is refused. Package managers open far
more connections at once than they keep (npm 9 through a proxy: one per request, hundreds): a
burst waits its turn, a sustained flood is refused."""
QUEUE_POLL = 0.005
MAX_HANDSHAKES = 32
"""Connections at once whose request is overdue (none for :data:`HANDSHAKE_STALL_S`): a slowloris
flood stops here, not at EMFILE."""
HANDSHAKE_STALL_S = 1.0
"""How long a connection may stay silent before it counts against :data:`MAX_HANDSHAKES`. A burst of
fresh connections is how a package manager fetches (npm 9 opens 40 at once, each sending its request
within milliseconds): only :data:`MAX_CONNECTIONS` bounds those."""
REFUSAL_WAIT = 1.0
"""How long a connection over a cap may take to show its protocol (its refusal is written in it)."""
MAX_REFUSING = 16
"""Refusals being written at once; past it a connection over a cap is closed without a word."""
_OVER_LIMIT = "(connection limit)"
"""The host of an over-limit denial: the refused connection's request was never read."""
HTTP_PORT = 80
"""A tunnel to this port must carry HTTP (judged request by request); elsewhere other protocols pass."""
HTTP_START_LIMIT = 64
"""Bytes enough to tell whether a tunnel's client begins an HTTP request line (empty lines, a method)."""
CHUNK_LINE_LIMIT = 4096
_REQUEST_START = re.compile(rb"[\r\n]*([A-Z]{0,24})")
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+\Z")
_HEX = re.compile(rb"[0-9a-fA-F]{1,16}\Z")
RELAY_JOIN_TIMEOUT = 5.0
_STATUS = {
    "bad-request": "400 Bad Request",
    "resolve-failed": "502 Bad Gateway",
    "connect-failed": "502 Bad Gateway",
    "upstream-failed": "502 Bad Gateway",
}  # every other reason is the policy's: 403
_SOCKS_REPLY = {"resolve-failed": 0x04, "connect-failed": 0x05, "upstream-failed": 0x01, "bad-request": 0x07}
_TLS_ACCESS_DENIED = b"\x15\x03\x03\x00\x02\x02\x31"  # a fatal access_denied alert, before any ServerHello
_NO_SNI = "(no server name)"
"""The host of a transparent TLS connection's denial when its ClientHello names none (DNAT hid the address)."""
_IP_FREEBIND = getattr(socket, "IP_FREEBIND", 15)  # Linux's value; the constant is in Python 3.12+
_Role = Literal["unix", "tcp", "transparent-http", "transparent-tls"]
_Handler = Callable[[socket.socket, "_Slot"], Coroutine[Any, Any, None]]
_HOP_BY_HOP = frozenset({"connection", "proxy-connection", "keep-alive", "proxy-authorization", "te", "upgrade"})


@dataclass(frozen=True)
class Denial:
    """One refused connection, as the audit, the tool result and the JSON-RPC stream carry it."""

    host: str
    port: int
    reason: DenialReason
    rule: str | None
    message: str

    def line(self) -> str:
        """The one line a model reads for this denial."""
        return f"sandbox: connection to {_where(self.host, self.port)} refused ({self.reason}): {self.message}"


@dataclass(frozen=True)
class Connected:
    """One allowed connection: ``address`` is what the proxy connected to (``via upstream h:p`` if chained)."""

    host: str
    port: int
    address: str
    rule: str | None
    protocol: ProxyProtocol


Approver = Callable[[str, int], Awaitable[Answer]]
"""Asked about a destination the policy does not know (``ask = true``): host and port in, an answer out."""
OnDenial = Callable[[Denial], Awaitable[None] | None]
OnConnect = Callable[[Connected], Awaitable[None] | None]


class _Refused(Exception):
    def __init__(self, host: str, port: int, reason: DenialReason, rule: str | None, message: str) -> None:
        super().__init__(message)
        self.denial = Denial(host, port, reason, rule, message)

    @classmethod
    def of(cls, host: str, port: int, verdict: Verdict) -> _Refused:
        return cls(host, port, denial_reason(verdict), verdict.rule, verdict.message)


class Service:
    """A server with ``start`` and ``aclose`` (run in one task: they hold a task group), as
    ``async with`` or ``await task_group.start(service.serve)``."""

    async def start(self) -> None:
        raise NotImplementedError

    async def aclose(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def serve(self, *, task_status: TaskStatus[Self] = anyio.TASK_STATUS_IGNORED) -> None:
        """Run until cancelled."""
        async with self:
            task_status.started(self)
            await anyio.sleep_forever()


class EgressProxy(Service):
    """The filtering proxy; ``async with``, ``start``/``aclose``, ``serve`` or :meth:`serve_in_thread`.

    ``start`` and ``aclose`` must run in the same task (they hold a task group). ``upstream`` is an
    ``http://[user:pass@]host:port`` proxy to chain to (see :func:`upstream_from_env`).
    ``transparent_http`` and ``transparent_tls`` are the addresses of the transparent listeners
    (port 0 picks one; see the bound ones in :attr:`transparent_http_address` and
    :attr:`transparent_tls_address`); ``transparent_tls_port`` is the port the redirected TLS
    connections were made to, which DNAT hides (443, the only one redirected; tests name their server's).
    ``max_connections`` and ``max_handshakes`` cap what one proxy (a session's) holds at once; a
    connection past either is refused in its own protocol (HTTP 503, a SOCKS failure, a TLS alert)
    and recorded as an ``over-limit`` denial.
    """

    def __init__(
        self,
        policy: EgressPolicy,
        *,
        unix_path: str | os.PathLike[str] | None = None,
        tcp: tuple[str, int] | None = None,
        transparent_http: tuple[str, int] | None = None,
        transparent_tls: tuple[str, int] | None = None,
        transparent_tls_port: int = 443,
        resolver: Resolver | None = None,
        approver: Approver | None = None,
        ask_timeout: float = 60.0,
        upstream: str | None = None,
        on_denial: OnDenial | None = None,
        on_connect: OnConnect | None = None,
        connect_timeout: float = 10.0,
        resolve_timeout: float = 10.0,
        max_connections: int = MAX_CONNECTIONS,
        max_handshakes: int = MAX_HANDSHAKES,
        queue_wait: float = QUEUE_WAIT,
    ) -> None:
        if unix_path is None and tcp is None and transparent_http is None and transparent_tls is None:
            raise InvalidArgument("the egress proxy needs a unix socket path or a TCP address to listen on")
        self.policy = policy
        self.unix_path = None if unix_path is None else Path(unix_path)
        self._tcp: dict[_Role, tuple[str, int] | None] = {
            "tcp": tcp,
            "transparent-http": transparent_http,
            "transparent-tls": transparent_tls,
        }
        self.transparent_tls_port = transparent_tls_port
        self.resolver: Resolver = resolver or SystemResolver()
        self.approver, self.ask_timeout = approver, ask_timeout
        self.upstream = None if upstream is None else _Upstream.parse(upstream)
        self.on_denial, self.on_connect = on_denial, on_connect
        self.connect_timeout, self.resolve_timeout = connect_timeout, resolve_timeout
        self.max_connections, self.max_handshakes = max_connections, max_handshakes
        self.queue_wait = queue_wait
        self.handshakes = self.connections = self._refusing = 0  # on the proxy's event loop only
        self._pending: dict[_Slot, float] = {}  # handshakes by when they began, oldest first
        self._over_limit_at = float("-inf")
        self.denials: list[Denial] = []
        self._grants: set[tuple[str, int]] = set()
        self._ask_locks: defaultdict[tuple[str, int], anyio.Lock] = defaultdict(anyio.Lock)
        self._listeners: dict[_Role, socket.socket] = {}
        self._relays: set[_Relay] = set()
        self._relays_lock = threading.Lock()
        self._tg: TaskGroup | None = None

    # -- lifecycle -----------------------------------------------------------------------------
    @property
    def tcp_address(self) -> tuple[str, int] | None:
        """The TCP address actually bound (the port chosen when asked for 0), once started."""
        return self._bound("tcp")

    @property
    def transparent_http_address(self) -> tuple[str, int] | None:
        return self._bound("transparent-http")

    @property
    def transparent_tls_address(self) -> tuple[str, int] | None:
        return self._bound("transparent-tls")

    def _bound(self, role: _Role) -> tuple[str, int] | None:
        listener = self._listeners.get(role)
        return None if listener is None else listener.getsockname()[:2]

    async def start(self) -> None:
        if self._tg is not None:
            raise InvalidArgument("the egress proxy is already running")
        self._listeners = self._bind()
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        handlers = {
            "unix": self._handle_unix,
            "tcp": self._handle_tcp,
            "transparent-http": self._handle_transparent_http,
            "transparent-tls": self._handle_transparent_tls,
        }
        for role, listener in self._listeners.items():
            self._tg.start_soon(self._accept_loop, self._tg, listener, handlers[role])

    async def aclose(self) -> None:
        """Stop accepting, end every handshake and every relay; clients see their connections close."""
        tg, self._tg = self._tg, None
        try:
            if tg is not None:
                tg.cancel_scope.cancel()
                await tg.__aexit__(None, None, None)
        finally:
            self._close_listeners()
            with self._relays_lock:
                relays = list(self._relays)
            for relay in relays:
                relay.close()
            with anyio.CancelScope(shield=True):  # the sockets are shut already; this waits for their close
                await anyio.to_thread.run_sync(_join, relays, RELAY_JOIN_TIMEOUT)

    def serve_in_thread(self) -> ProxyThread:
        """Start the proxy on an event loop of its own thread, for a synchronous caller."""
        with contextlib.ExitStack() as cleanup_on_fail:
            portal = cleanup_on_fail.enter_context(anyio.from_thread.start_blocking_portal())
            cleanup_on_fail.enter_context(portal.wrap_async_context_manager(self))
            return ProxyThread(self, portal, cleanup_on_fail.pop_all())

    def _bind(self) -> dict[_Role, socket.socket]:
        listeners: dict[_Role, socket.socket] = {}
        with contextlib.ExitStack() as cleanup_on_fail, map_errors("egress proxy: cannot listen", BackendUnavailable):
            if self.unix_path is not None:
                listeners["unix"] = cleanup_on_fail.enter_context(_listen_unix(self.unix_path))
            for role, address in self._tcp.items():
                if address is not None:
                    freebind = role != "tcp"  # a transparent address is the veth's, which may come later
                    listeners[role] = cleanup_on_fail.enter_context(_listen_tcp(*address, freebind=freebind))
            cleanup_on_fail.pop_all()
        return listeners

    def _close_listeners(self) -> None:
        listeners, self._listeners = list(self._listeners.values()), {}
        for listener in listeners:
            listener.close()
        if listeners and self.unix_path is not None:
            with contextlib.suppress(FileNotFoundError):
                self.unix_path.unlink()

    async def _accept_loop(self, tg: TaskGroup, listener: socket.socket, handle: _Handler) -> None:
        while True:
            await anyio.wait_readable(listener)
            await self._place()
            try:
                sock, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                continue
            except OSError as exc:  # EMFILE and kin: keep serving the connections we have
                log.warning("egress proxy: accept failed: %s", exc)
                await anyio.sleep(0.05)
                continue
            sock.setblocking(False)
            _nodelay(sock)
            tg.start_soon(self._admit, handle, sock)

    async def _admit(self, handle: _Handler, sock: socket.socket) -> None:
        why = self._over_limit()
        if why is not None:
            await self._refuse_over_limit(sock, handle, why)
            return
        slot = _Slot(self)
        try:
            await handle(sock, slot)
        finally:
            slot.release()

    def _held(self) -> int:
        return self.connections + len(self._relays)

    async def _place(self) -> None:
        """Leave the next connection in the backlog while every place is taken, up to ``queue_wait``."""
        waited = 0.0
        while self._held() >= self.max_connections and waited < self.queue_wait:
            await anyio.sleep(QUEUE_POLL)
            waited += QUEUE_POLL

    def _stalled(self) -> int:
        """Handshakes older than :data:`HANDSHAKE_STALL_S` (the oldest come first: stop at a young one)."""
        since = time.monotonic() - HANDSHAKE_STALL_S
        count = 0
        for began in self._pending.values():
            if began > since:
                break
            count += 1
        return count

    def _over_limit(self) -> str | None:
        stalled = self._stalled()
        if stalled >= self.max_handshakes:
            return (
                f"{stalled} connections have sent no request for {HANDSHAKE_STALL_S:g} s or more"
                f" (at most {self.max_handshakes})"
            )
        held = self._held()
        if held >= self.max_connections:
            return f"{held} connections are open (at most {self.max_connections} per session)"
        return None

    async def _refuse_over_limit(self, sock: socket.socket, handle: _Handler, why: str) -> None:
        """Refuse a connection past a cap in its own protocol, briefly (it holds descriptors too), then close it.

        A flood is recorded once a second, not once a connection: the record must not become the flood."""
        now = time.monotonic()
        if now - self._over_limit_at >= 1.0:
            self._over_limit_at = now
            await self._deny(Denial(_OVER_LIMIT, 0, "over-limit", None, f"the proxy refused a connection: {why}"))
        if self._refusing >= MAX_REFUSING:
            sock.close()
            return
        self._refusing += 1
        try:
            with anyio.move_on_after(REFUSAL_WAIT):
                sock = await _refusal_peer(sock) if handle == self._handle_unix else sock
                await _refuse_in_kind(sock, transparent_tls=handle == self._handle_transparent_tls)
        except OSError:
            pass
        finally:
            sock.close()
            self._refusing -= 1

    # -- one connection ------------------------------------------------------------------------
    async def _handle_tcp(self, sock: socket.socket, slot: _Slot) -> None:
        await self._handle(_Conn(sock, slot))

    async def _handle_unix(self, sock: socket.socket, slot: _Slot) -> None:
        """A connection on the unix socket: a byte stream, or a jail's forwarder handing over the
        jail's TCP connection itself (one zero byte with the descriptor), relayed with no extra hop."""
        try:
            with anyio.fail_after(HANDSHAKE_TIMEOUT):
                await anyio.wait_readable(sock)
            data, fds, _flags, _address = socket.recv_fds(sock, 1, 1)
        except (OSError, TimeoutError):
            sock.close()
            return
        except BaseException:  # cancelled (the proxy closing): the socket is ours to close still
            sock.close()
            raise
        if not fds:
            conn = _Conn(sock, slot)
            conn.buffer += data
            await self._handle(conn) if data else conn.close()
            return
        sock.close()
        client = _adopt(fds[0]) if data == b"\0" else None
        if client is None:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            return
        await self._handle(_Conn(client, slot))

    async def _handle(self, client: _Conn) -> None:
        await self._guarded(client, self._sniff)

    async def _handle_transparent_http(self, sock: socket.socket, slot: _Slot) -> None:
        await self._guarded(_Conn(sock, slot), self._transparent_http)

    async def _handle_transparent_tls(self, sock: socket.socket, slot: _Slot) -> None:
        await self._guarded(_Conn(sock, slot), self._transparent_tls)

    async def _guarded(self, client: _Conn, serve: Callable[[_Conn], Awaitable[None]]) -> None:
        try:
            await serve(client)
        except (OSError, EOFError, TimeoutError):
            pass  # the client went away or stalled: nothing was opened for it
        except Exception:
            log.exception("egress proxy: connection failed")
        finally:
            client.close()

    async def _sniff(self, client: _Conn) -> None:
        """Tell the protocol by the first byte: SOCKS5 or HTTP."""
        with anyio.fail_after(HANDSHAKE_TIMEOUT):
            if not client.buffer:
                await client.fill()
        if client.buffer[0] == 0x05:
            await self._socks(client)
        else:
            await self._http(client)

    async def _transparent_http(self, client: _Conn) -> None:
        await self._http(client, transparent=True)

    async def _http(self, client: _Conn, *, transparent: bool = False) -> None:
        try:
            with anyio.fail_after(HANDSHAKE_TIMEOUT):
                head = await client.read_until(b"\r\n\r\n", HEAD_LIMIT)
            client.settle()
            request = _HttpRequest.parse(head)
            if request.method == "CONNECT" and transparent:
                raise ValueError("CONNECT on the transparent HTTP port: the jail has no proxy to talk to here")
            if request.method == "CONNECT":
                await self._http_connect(client, request)
            else:
                await self._http_forward(client, request, "transparent-http" if transparent else "http")
        except _Refused as refused:
            await self._deny(refused.denial)
            await client.send_all(_http_refusal(refused.denial))
        except ValueError as exc:
            await client.send_all(_http_response("400 Bad Request", {}, f"sandbox: bad proxy request: {exc}\n"))

    async def _http_connect(self, client: _Conn, request: _HttpRequest) -> None:
        host, port = _split_authority(request.target, None)
        upstream = await self._open(host, port, "connect")
        try:
            await client.send_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await self._tunnel(client, upstream, host, port)
        finally:
            upstream.conn.close()

    async def _http_forward(self, client: _Conn, request: _HttpRequest, protocol: ProxyProtocol) -> None:
        host, port, _path = request.destination()
        upstream = await self._open(host, port, protocol)
        try:
            await self._http_stream(client, upstream.conn, _Exchange(host, port, rewrite=True), request)
        finally:
            upstream.conn.close()

    async def _http_stream(self, client: _Conn, server: _Conn, exchange: _Exchange, first: _HttpRequest | None) -> None:
        """Relay an HTTP/1 conversation judging *every* request the client sends, not only the first.

        The server's bytes flow back as they come; the client's are read request by request (head,
        then a body framed by ``Content-Length`` or chunked encoding), so nothing the client sends
        reaches the server unjudged. A request for another destination ends the connection at once
        and is recorded as a denial.
        """
        refused: _Refused | None = None
        async with anyio.create_task_group() as tg:
            tg.start_soon(_responses, server, client, tg.cancel_scope, exchange.rewrite)
            try:
                await self._requests(client, server, exchange, first)
                with contextlib.suppress(OSError):
                    server.raw.shutdown(socket.SHUT_WR)  # the client is done; the responses go on
            except _Refused as exc:
                refused = exc
                tg.cancel_scope.cancel()
            except (OSError, EOFError, ValueError):
                tg.cancel_scope.cancel()
        if refused is not None:
            await self._deny(refused.denial)

    async def _requests(self, client: _Conn, server: _Conn, exchange: _Exchange, request: _HttpRequest | None) -> None:
        while True:
            if request is None:
                try:
                    head = await _read_head(client)
                except EOFError:
                    return
                request = self._judged(head, exchange)
            await server.send_all(exchange.head(request))
            try:
                await _copy_body(client, server, request)
            except ValueError as exc:  # a body whose framing breaks midway: what follows cannot be judged
                why = f"bad request body on the connection: {exc}"
                raise _Refused(exchange.host, exchange.port, "bad-request", None, why) from None
            request = None

    def _judged(self, head: bytes, exchange: _Exchange) -> _HttpRequest:
        """A further request on the connection, parsed; :class:`_Refused` unless it goes where the first went."""
        try:
            request = _HttpRequest.parse(head)
            host, port = exchange.destination(request)
        except ValueError as exc:
            why = f"bad request on the connection: {exc}"
            raise _Refused(exchange.host, exchange.port, "bad-request", None, why) from None
        if (host, port) == (exchange.host, exchange.port):
            return request
        verdict = self.policy.decide(host, port)
        if not verdict.allowed:
            raise _Refused.of(host, port, verdict)
        where = _where(exchange.host, exchange.port)
        message = f"a connection to {where} carried a request for {_where(host, port)}: one destination per connection"
        raise _Refused(host, port, "host-mismatch", None, message)

    async def _socks(self, client: _Conn) -> None:
        with anyio.fail_after(HANDSHAKE_TIMEOUT):
            if not await _socks_greeting(client):
                return
            command, host, port = await _socks_request(client)
        client.settle()
        try:
            if command != 0x01:
                raise _Refused(host, port, "bad-request", None, f"SOCKS5 command {command} is not supported")
            upstream = await self._open(host, port, "socks5")
        except _Refused as refused:
            await self._deny(refused.denial)
            await client.send_all(_socks_reply(_SOCKS_REPLY.get(refused.denial.reason, 0x02)))
            return
        try:
            await client.send_all(_socks_reply(0x00))
            await self._tunnel(client, upstream, host, port)
        finally:
            upstream.conn.close()

    async def _transparent_tls(self, client: _Conn) -> None:
        """A redirected TLS connection: the ClientHello's SNI is the destination, on port 443."""
        port = self.transparent_tls_port
        try:
            with anyio.fail_after(HANDSHAKE_TIMEOUT):
                host = await _read_sni(client, port)
            client.settle()
            upstream = await self._open(host, port, "transparent-tls")
        except _Refused as refused:
            await self._deny(refused.denial)
            await client.send_all(_TLS_ACCESS_DENIED)  # curl and openssl print "access denied", not a bare EOF
            return
        try:
            await self._relay(client, upstream)  # the buffered ClientHello goes first
        finally:
            upstream.conn.close()

    async def _tunnel(self, client: _Conn, upstream: _Opened, host: str, port: int) -> None:
        """Check the client's first bytes before any reach the server, then relay: a TLS ClientHello's
        SNI must name the tunnel's host; plain HTTP is judged request by request (:meth:`_http_stream`)."""
        if await _first_speaker(client, upstream.conn) is client:
            try:
                plain = not await _check_sni(client, host, port) and await _speaks_http(client, host, port)
            except _Refused as refused:
                await self._deny(refused.denial)
                return
            except EOFError:
                return
            if plain:
                exchange = _Exchange(_comparable(host), port, rewrite=False)
                await self._http_stream(client, upstream.conn, exchange, None)
                return
        await self._relay(client, upstream)

    async def _relay(self, client: _Conn, upstream: _Opened) -> None:
        await upstream.conn.send_all(client.take())
        await client.send_all(upstream.conn.take())
        relay = _Relay(client.detach(), upstream.conn.detach(), self._relay_done)
        with self._relays_lock:
            self._relays.add(relay)
        relay.start()

    def _relay_done(self, relay: _Relay) -> None:
        with self._relays_lock:
            self._relays.discard(relay)

    # -- policy, approval, resolution, connection ------------------------------------------------
    async def _open(self, host: str, port: int, protocol: ProxyProtocol) -> _Opened:
        """A connection to the destination, reported to ``on_connect``; :class:`_Refused` says why not."""
        opened = await self._open_checked(host, port)
        try:
            await self._report(self.on_connect, Connected(host, port, opened.address, opened.rule, protocol))
        except BaseException:
            opened.conn.close()
            raise
        return opened

    async def _open_checked(self, host: str, port: int) -> _Opened:
        verdict = self.policy.decide(host, port)
        if verdict.allowed is False:
            raise _Refused.of(host, port, verdict)
        asked = verdict.allowed is None
        if asked:
            verdict = await self._ask(host, port, verdict)
        if self.upstream is not None:
            return await self._via_upstream(self.upstream, host, port, verdict)
        addresses = await self._checked_addresses(host, port, verdict, asked=asked)
        conn, address = await self._connect_any(host, port, addresses)
        return _Opened(conn, _where(str(address), port), verdict.rule)

    async def _ask(self, host: str, port: int, verdict: Verdict) -> Verdict:
        if not self.policy.ask:
            raise _Refused.of(host, port, verdict)
        key = (host.lower().rstrip("."), port)
        async with self._ask_locks[key]:  # one question per destination at a time; a session grant answers the rest
            if key in self._grants:
                return Verdict(
                    True, "ask:allow-session", "allowed", f"{_where(host, port)} was allowed for the session"
                )
            answer = await self._approval(host, port)
            if answer == "allow-session":
                self._grants.add(key)
            return Verdict(True, f"ask:{answer}", "allowed", f"{_where(host, port)} was allowed by the user ({answer})")

    async def _approval(self, host: str, port: int) -> Answer:
        where = _where(host, port)
        if self.approver is None:
            raise _Refused(
                host, port, "ask-unavailable", None, f"{where} is not on the allowlist and no one can be asked"
            )
        try:
            with anyio.fail_after(self.ask_timeout):
                answer = await self.approver(host, port)
        except TimeoutError:
            raise _Refused(
                host, port, "ask-timeout", None, f"no answer about {where} in {self.ask_timeout:g} s"
            ) from None
        except Exception as exc:
            log.warning("egress proxy: approver failed for %s: %r", where, exc)
            raise _Refused(host, port, "ask-unavailable", None, f"asking about {where} failed: {exc}") from None
        if answer == "allow-once" or answer == "allow-session":  # anything else, even a malformed answer, denies
            return answer
        raise _Refused(host, port, "ask-denied", None, f"the user denied {where}")

    async def _checked_addresses(self, host: str, port: int, verdict: Verdict, *, asked: bool) -> list[IPAddress]:
        literal = literal_address(host)
        if literal is not None and asked:
            return [literal]  # the user approved this very address
        addresses = [literal] if literal is not None else await self._resolve(host, port)
        for ip in addresses:
            check = self.policy.check_address(ip, port, name_rule=verdict.rule)
            if not check.allowed:
                raise _Refused(host, port, denial_reason(check), check.rule, f"{host}: {check.message}")
        return addresses

    async def _resolve(self, host: str, port: int) -> list[IPAddress]:
        try:
            with anyio.fail_after(self.resolve_timeout):
                addresses = await self.resolver.resolve(host)
        except Exception as exc:
            raise _Refused(
                host, port, "resolve-failed", None, f"resolving {host} failed: {exc or type(exc).__name__}"
            ) from None
        if not addresses:
            raise _Refused(host, port, "resolve-failed", None, f"{host} has no address")
        return addresses

    async def _connect_any(self, host: str, port: int, addresses: list[IPAddress]) -> tuple[_Conn, IPAddress]:
        failures: list[str] = []
        for ip in addresses:
            try:
                with anyio.fail_after(self.connect_timeout):
                    return await _connect(str(ip), port), ip
            except (OSError, TimeoutError) as exc:
                failures.append(f"{_where(str(ip), port)}: {exc.strerror if isinstance(exc, OSError) else 'timed out'}")
        raise _Refused(host, port, "connect-failed", None, "connecting failed: " + "; ".join(failures))

    async def _via_upstream(self, upstream: _Upstream, host: str, port: int, verdict: Verdict) -> _Opened:
        target = _where(host, port)
        try:
            with anyio.fail_after(self.connect_timeout):
                conn = await _connect_name(upstream.host, upstream.port)
        except (OSError, TimeoutError) as exc:
            raise _Refused(host, port, "upstream-failed", None, f"upstream proxy {upstream}: {exc}") from None
        try:
            with anyio.fail_after(self.connect_timeout):
                status = await upstream.connect(conn, target)
        except (OSError, EOFError, TimeoutError, ValueError) as exc:
            conn.close()
            raise _Refused(host, port, "upstream-failed", None, f"upstream proxy {upstream}: {exc!r}") from None
        except BaseException:
            conn.close()
            raise
        if status != 200:
            conn.close()
            raise _Refused(
                host, port, "upstream-failed", None, f"upstream proxy {upstream} answered {status} to {target}"
            )
        return _Opened(conn, f"via upstream {upstream}", verdict.rule)

    async def _deny(self, denial: Denial) -> None:
        self.denials.append(denial)
        await self._report(self.on_denial, denial)

    async def _report(self, callback: Callable[[_E], Awaitable[None] | None] | None, event: _E) -> None:
        if callback is None:
            return
        try:
            result = callback(event)
            if inspect.isawaitable(result):
                await result
        except Exception:
            log.exception("egress proxy: the %s callback failed", type(event).__name__)


class ProxyThread:
    """A proxy serving on its own thread's event loop; :meth:`close` stops it and ends every relay."""

    def __init__(self, proxy: EgressProxy, portal: BlockingPortal, stack: contextlib.ExitStack) -> None:
        self.proxy = proxy
        self._portal = portal
        self._stack = stack

    @property
    def tcp_address(self) -> tuple[str, int] | None:
        return self.proxy.tcp_address

    @property
    def denials(self) -> list[Denial]:
        return self.proxy.denials

    def run_beside(self, service: AbstractAsyncContextManager[_S]) -> _S:
        """Enter ``service`` (e.g. a :class:`~sandbox.network.dnsfilter.FilteringDns`) on the proxy's
        event loop and thread; :meth:`close` exits it before it stops the proxy."""
        return self._stack.enter_context(self._portal.wrap_async_context_manager(service))

    def close(self) -> None:
        self._stack.close()

    def __enter__(self) -> ProxyThread:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def upstream_from_env(env: Mapping[str, str] | None = None) -> str | None:
    """The proxy the executor itself must use: ``HTTPS_PROXY``, ``HTTP_PROXY``, then ``ALL_PROXY``.

    Only ``http://`` proxies can be chained (by CONNECT); any other scheme is an
    :class:`InvalidArgument`. ``NO_PROXY`` is not honoured: every connection goes through it.
    """
    env = os.environ if env is None else env
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        value = env.get(name, "").strip()
        if value:
            _Upstream.parse(value)
            return value
    return None


# -- the pieces: a socket with a buffer, the relay, parsers -----------------------------------------
_E = TypeVar("_E", Denial, Connected)
_S = TypeVar("_S")


@dataclass(frozen=True)
class _Opened:
    conn: _Conn
    address: str
    rule: str | None


class _Conn:
    """A non-blocking socket and what was read from it but not yet used (the handshake's side)."""

    def __init__(self, sock: socket.socket, slot: _Slot | None = None) -> None:
        self.sock: socket.socket | None = sock
        self.buffer = bytearray()
        self.slot = slot

    def settle(self) -> None:
        """The client's request has arrived: it no longer counts as a pending handshake."""
        if self.slot is not None:
            self.slot.settle()

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

    async def copy_exact(self, sink: _Conn, size: int) -> None:
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


class _Slot:
    """One accepted connection's place under the proxy's caps: a handshake until :meth:`settle`,
    a connection until :meth:`release` (a relay it hands over to counts on in the proxy's relays)."""

    def __init__(self, proxy: EgressProxy) -> None:
        self._proxy = proxy
        self._settled = self._released = False
        proxy.handshakes += 1
        proxy.connections += 1
        proxy._pending[self] = time.monotonic()

    def settle(self) -> None:
        if not self._settled:
            self._settled = True
            self._proxy.handshakes -= 1
            del self._proxy._pending[self]

    def release(self) -> None:
        self.settle()
        if not self._released:
            self._released = True
            self._proxy.connections -= 1


async def _refusal_peer(sock: socket.socket) -> socket.socket:
    """The client behind a unix connection: the TCP connection a forwarder hands over, else itself."""
    await anyio.wait_readable(sock)
    data, fds, _flags, _address = socket.recv_fds(sock, 1, 1, socket.MSG_PEEK)
    if not fds:
        return sock
    for extra in fds[1:]:
        os.close(extra)
    if data != b"\0":
        os.close(fds[0])
        raise OSError(errno.EPROTO, "not a connection handed over")
    client = _adopt(fds[0])  # closes the descriptor itself when it is not a connection
    if client is None:
        raise OSError(errno.EPROTO, "not a connection handed over")
    sock.close()
    return client


async def _refuse_in_kind(sock: socket.socket, *, transparent_tls: bool) -> None:
    """A 503 (HTTP), a general SOCKS failure or a TLS alert, as the client's first byte shows."""
    first = b""
    if not transparent_tls:
        with anyio.move_on_after(REFUSAL_WAIT / 2):
            await anyio.wait_readable(sock)
            first = sock.recv(1, socket.MSG_PEEK)
    if transparent_tls:
        reply = _TLS_ACCESS_DENIED
    elif first == b"\x05":
        reply = b"\x05\xff"  # "no acceptable method": the SOCKS client gives up before its request
    else:
        body = "sandbox: the proxy refused the connection (over-limit): too many connections at once\n"
        reply = _http_response("503 Service Unavailable", {"X-Sandbox-Denial": "over-limit"}, body)
    sock.setblocking(False)
    with contextlib.suppress(BlockingIOError):
        sock.send(reply)


def _adopt(fd: int) -> socket.socket | None:
    """A connected stream socket handed over by a jail's forwarder, or ``None`` for anything else
    (a file, a pipe, a listening or datagram socket: a jail chooses what it sends)."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        return None
    try:
        if sock.type != socket.SOCK_STREAM or sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
            sock.close()
            return None
        sock.setblocking(False)
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            _nodelay(sock)
    except OSError:
        sock.close()
        return None
    return sock


async def _connect(host: str, port: int) -> _Conn:
    ip = literal_address(host)
    family = socket.AF_INET6 if ip is not None and ip.version == 6 else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setblocking(False)
        _nodelay(sock)
        code = sock.connect_ex((host, port))
        if code == errno.EINPROGRESS:
            await anyio.wait_writable(sock)
            code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if code:
            raise OSError(code, os.strerror(code))
    except BaseException:
        sock.close()
        raise
    return _Conn(sock)


async def _connect_name(host: str, port: int) -> _Conn:
    """Connect to the upstream proxy, whose name the host's own resolver knows."""
    if literal_address(host) is not None:
        return await _connect(host, port)
    addresses = await SystemResolver().resolve(host)
    if not addresses:
        raise OSError(errno.EHOSTUNREACH, f"{host} has no address")
    return await _connect(str(addresses[0]), port)


async def _first_speaker(client: _Conn, server: _Conn) -> _Conn:
    """Whichever side sends first: TLS clients speak first, SMTP or SSH servers do."""
    if client.buffer or server.buffer:
        return client if client.buffer else server
    first: list[_Conn] = []
    async with anyio.create_task_group() as tg:

        async def wait(conn: _Conn) -> None:
            await anyio.wait_readable(conn.raw)
            first.append(conn)
            tg.cancel_scope.cancel()

        tg.start_soon(wait, client)
        tg.start_soon(wait, server)
    return first[0]


async def _hello_sni(client: _Conn) -> str | None:
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


async def _read_sni(client: _Conn, port: int) -> str:
    """The host a transparent TLS connection's ClientHello names; :class:`_Refused` (``bad-request``) if none."""
    try:
        sni = await _hello_sni(client)
    except NotClientHello:
        raise _no_sni(port, "the connection does not begin with a TLS ClientHello") from None
    except ValueError as exc:
        raise _no_sni(port, f"malformed TLS ClientHello: {exc}") from None
    if sni is None:
        raise _no_sni(port, "the TLS ClientHello names no server (SNI)")
    try:
        return _normal_host(sni)
    except ValueError as exc:
        raise _no_sni(port, f"the TLS server name is unusable: {exc}") from None


def _no_sni(port: int, why: str) -> _Refused:
    message = f"{why}; a redirected TLS connection is judged by its server name (SNI), so connect by name"
    return _Refused(_NO_SNI, port, "bad-request", None, message)


async def _check_sni(client: _Conn, host: str, port: int) -> bool:
    """Read the client's ClientHello (if it sends TLS: ``True``) and refuse an SNI that names another host."""
    try:
        with anyio.fail_after(HANDSHAKE_TIMEOUT):
            sni = await _hello_sni(client)
    except NotClientHello:
        return False
    except ValueError as exc:
        raise _Refused(host, port, "bad-request", None, f"malformed TLS ClientHello: {exc}") from None
    if sni is not None and sni.rstrip(".").lower() != host.rstrip(".").lower():
        raise _Refused(host, port, "sni-mismatch", None, f"the tunnel to {_where(host, port)} carries TLS for {sni!r}")
    return True


async def _speaks_http(client: _Conn, host: str, port: int) -> bool:
    """Whether a tunnel's client (not TLS) begins an HTTP/1 request: empty lines, then a method and a space.

    On port 80 it must: a tunnel to the plain HTTP port carries nothing else (``bad-request``).
    Elsewhere another protocol (a database's, git's) is relayed as it comes.
    """
    with anyio.fail_after(HANDSHAKE_TIMEOUT):
        while (verdict := _http_start(bytes(client.buffer))) is None:
            await client.fill()
    if not verdict and port == HTTP_PORT:
        raise _Refused(host, port, "bad-request", None, f"a tunnel to {_where(host, port)} must carry HTTP")
    return verdict


def _http_start(data: bytes) -> bool | None:
    """``True`` if ``data`` begins an HTTP request line, ``False`` if it cannot, ``None`` if too short to say."""
    match = _REQUEST_START.match(data)
    if match is None:  # never: every part of the pattern is optional
        return False
    if match.end() == len(data):
        return None if len(data) < HTTP_START_LIMIT else False
    return data[match.end() : match.end() + 1] == b" " and match.group(1) != b""


class _Relay:
    """Two threads moving bytes between two blocking sockets until both directions end."""

    def __init__(self, a: socket.socket, b: socket.socket, done: Callable[[_Relay], None]) -> None:
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


def _join(relays: list[_Relay], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for relay in relays:
        relay.ended.wait(max(0.0, deadline - time.monotonic()))


_HAVE_SPLICE = hasattr(os, "splice")
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)


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


def _listen_unix(path: Path) -> socket.socket:
    if path.is_socket():  # left by a proxy that died; a regular file there is an error below
        path.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    return _listen(sock, str(path))


def _listen_tcp(host: str, port: int, *, freebind: bool = False) -> socket.socket:
    sock = bind_socket(host, port, socket.SOCK_STREAM, freebind=freebind)
    return _listen(sock, None)


def bind_socket(host: str, port: int, kind: socket.SocketKind, *, freebind: bool) -> socket.socket:
    """A non-blocking TCP or UDP socket bound to ``host`` (an IP address) and ``port``.

    ``freebind`` (``IP_FREEBIND``) lets it bind an address no interface has yet: a transparent
    listener's address is the host's end of a veth pair that may be created after it.
    """
    ip = literal_address(host)
    if ip is None:
        raise OSError(errno.EINVAL, f"{host!r} is not an IP address")
    sock = socket.socket(socket.AF_INET6 if ip.version == 6 else socket.AF_INET, kind)
    try:
        if kind == socket.SOCK_STREAM:  # not for UDP, where it would let a second server share the port
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if freebind:
            sock.setsockopt(socket.SOL_IP, _IP_FREEBIND, 1)
        sock.bind((str(ip), port))
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def _listen(sock: socket.socket, address: str | None) -> socket.socket:
    """Bind (unless bound already: ``address`` is ``None``) and listen, non-blocking."""
    try:
        if address is not None:
            sock.bind(address)
        sock.listen(socket.SOMAXCONN)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def _nodelay(sock: socket.socket) -> None:
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _where(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def denial_reason(verdict: Verdict) -> DenialReason:
    """A refusing verdict's reason as a denial's (``not-allowed`` for an allowed one refused without a grant)."""
    return "not-allowed" if verdict.reason == "allowed" else verdict.reason


# -- HTTP ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _HttpRequest:
    method: str
    target: str
    version: str
    headers: tuple[tuple[str, str], ...]

    @classmethod
    def parse(cls, head: bytes) -> _HttpRequest:
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
        named = [_split_authority(hosts[0], 0)[0]] if hosts else []
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
            return (*_split_authority(hosts[0], 80), self.target)
        host, port, path = _absolute_uri(self.target)
        if hosts and _split_authority(hosts[0], 80) != (host, port):
            message = f"the Host header {hosts[0]!r} disagrees with the URI {self.target[:200]!r}"
            raise _Refused(host, port, "host-mismatch", None, message)
        return host, port, path

    def forwarded(self, path: str) -> bytes:
        """The request for the server: origin form, no proxy headers, ``Connection: close``."""
        keep = [(k, v) for k, v in self.headers if k.lower() not in _HOP_BY_HOP]
        if not self.values("host"):
            host, port, _ = self.destination()
            keep.insert(0, ("Host", host if port == 80 else _where(host, port)))
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
    host, port = _split_authority(url.netloc, 80)
    path = url.path or "/"
    return host, port, f"{path}?{url.query}" if url.query else path


def _split_authority(authority: str, default_port: int | None) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` to a normalised host and a port."""
    if authority.startswith("["):
        host, _, rest = authority[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ("" if not rest else "x")
    else:
        host, _, port = authority.rpartition(":") if ":" in authority else (authority, "", "")
    if not port and default_port is not None:
        return _normal_host(host), default_port
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"no valid port in {authority[:80]!r}")
    return _normal_host(host), int(port)


def _comparable(host: str) -> str:
    """``host`` as a request's Host header is compared with it (a SOCKS client's name comes as sent)."""
    try:
        return _normal_host(host)
    except ValueError:
        return host


def _normal_host(host: str) -> str:
    ip = literal_address(host)
    if ip is not None:
        return str(ip)
    try:
        return normalize_host(host)
    except InvalidArgument:
        raise ValueError(f"{host[:80]!r} is not a host name") from None


@dataclass(frozen=True)
class _Exchange:
    """Where an HTTP conversation goes and how its requests are passed on: ``rewrite`` for a proxy
    request (origin form, ``Connection: close``), else as parsed (inside a tunnel)."""

    host: str
    port: int
    rewrite: bool

    def destination(self, request: _HttpRequest) -> tuple[str, int]:
        if self.rewrite:
            host, port, _path = request.destination()
            return host, port
        return request.tunnelled(self.host), self.port

    def head(self, request: _HttpRequest) -> bytes:
        return request.forwarded(request.destination()[2]) if self.rewrite else request.serialized()


async def _read_head(client: _Conn) -> bytes:
    """The next request head; empty lines before it are skipped, as servers do (RFC 9112, 2.2)."""
    while True:
        if not client.buffer:
            await client.fill()
        rest = client.buffer.lstrip(b"\r\n")
        del client.buffer[: len(client.buffer) - len(rest)]
        if client.buffer:
            return await client.read_until(b"\r\n\r\n", HEAD_LIMIT)


async def _copy_body(client: _Conn, server: _Conn, request: _HttpRequest) -> None:
    length = request.body_length()
    if length is None:
        await _copy_chunked(client, server)
    else:
        await client.copy_exact(server, length)


async def _copy_chunked(client: _Conn, server: _Conn) -> None:
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


async def _body_line(client: _Conn) -> bytes:
    line = await client.read_until(b"\r\n", CHUNK_LINE_LIMIT)
    if b"\n" in line[:-2] or b"\r" in line[:-2] or b"\0" in line:
        raise ValueError("a bare CR, LF or NUL in a chunked body's line")
    return line


async def _responses(server: _Conn, client: _Conn, scope: anyio.CancelScope, closing: bool = False) -> None:
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


async def _closing_heads(server: _Conn, client: _Conn) -> None:
    """Pass the response heads on with ``Connection: close`` (interim 1xx heads, then the final one)."""
    while True:
        head = await server.read_until(b"\r\n\r\n", HEAD_LIMIT)
        lines = head[:-4].decode("latin-1").split("\r\n")
        kept = [line for line in lines[1:] if line.partition(":")[0].strip().lower() not in _HOP_BY_HOP]
        await client.send_all(("\r\n".join([lines[0], *kept, "Connection: close"]) + "\r\n\r\n").encode("latin-1"))
        if not re.match(r"HTTP/\d(?:\.\d)? 1\d\d\b", lines[0]) or lines[0].startswith("HTTP/1.1 101"):
            return


def _http_refusal(denial: Denial) -> bytes:
    status = _STATUS.get(denial.reason, "403 Forbidden")
    return _http_response(status, {"X-Sandbox-Denial": denial.reason}, denial.line() + "\n")


def _http_response(status: str, headers: dict[str, str], body: str) -> bytes:
    data = body.encode()
    fields = {"Content-Type": "text/plain; charset=utf-8", **headers, "Content-Length": str(len(data))}
    lines = [f"HTTP/1.1 {status}", *(f"{k}: {v}" for k, v in fields.items()), "Connection: close"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + data


@dataclass(frozen=True)
class _Upstream:
    host: str
    port: int
    authorization: str | None

    @classmethod
    def parse(cls, url: str) -> _Upstream:
        parts = urllib.parse.urlsplit(url if "://" in url else f"http://{url}")
        try:
            port = parts.port or 80
        except ValueError:
            port = 0
        if parts.scheme.lower() != "http" or not parts.hostname or not port:
            raise InvalidArgument(f"upstream proxy {url!r}: only http://host:port proxies can be chained", url=url)
        auth = None
        if parts.username is not None:
            user = urllib.parse.unquote(parts.username)
            secret = urllib.parse.unquote(parts.password or "")
            auth = "Basic " + base64.b64encode(f"{user}:{secret}".encode()).decode()
        return cls(parts.hostname, port, auth)

    def __str__(self) -> str:
        return _where(self.host, self.port)

    async def connect(self, conn: _Conn, target: str) -> int:
        """Send ``CONNECT target``; the upstream's status code (bytes after its head stay buffered)."""
        lines = [f"CONNECT {target} HTTP/1.1", f"Host: {target}"]
        if self.authorization:
            lines.append(f"Proxy-Authorization: {self.authorization}")
        await conn.send_all(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        head = await conn.read_until(b"\r\n\r\n", HEAD_LIMIT)
        parts = head.split(b" ", 2)
        return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0


# -- SOCKS5 -------------------------------------------------------------------------------------
async def _socks_greeting(client: _Conn) -> bool:
    _version, count = await client.read_exact(2)
    methods = await client.read_exact(count)
    if 0x00 not in methods:
        await client.send_all(b"\x05\xff")  # only "no authentication": the unix socket is the credential
        return False
    await client.send_all(b"\x05\x00")
    return True


async def _socks_request(client: _Conn) -> tuple[int, str, int]:
    version, command, _reserved, kind = await client.read_exact(4)
    if version != 0x05:
        raise EOFError
    if kind == 0x01:
        host = socket.inet_ntop(socket.AF_INET, await client.read_exact(4))
    elif kind == 0x04:
        host = socket.inet_ntop(socket.AF_INET6, await client.read_exact(16))
    elif kind == 0x03:
        (size,) = await client.read_exact(1)
        host = (await client.read_exact(size)).decode("ascii", errors="replace")
    else:
        await client.send_all(_socks_reply(0x08))
        raise EOFError
    port = int.from_bytes(await client.read_exact(2), "big")
    return command, host, port


def _socks_reply(code: int) -> bytes:
    return bytes([0x05, code, 0x00, 0x01, 0, 0, 0, 0, 0, 0])


# -- TLS ClientHello ----------------------------------------------------------------------------
class NotClientHello(Exception):
    """The bytes do not begin a TLS handshake record: not TLS, nothing to check."""


class IncompleteHello(Exception):
    """A TLS handshake has begun but the ClientHello is not complete yet."""


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
