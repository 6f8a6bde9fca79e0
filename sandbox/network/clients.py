"""The client protocols of the egress proxy: HTTP CONNECT, plain HTTP forwarding and SOCKS5, on one port.

The protocol is told by the first byte: ``0x05`` is SOCKS5 (:mod:`~sandbox.network.socks`),
anything else is read as HTTP: ``CONNECT host:port`` opens a tunnel, any other method is forwarded
and judged request by request (:mod:`~sandbox.network.http`). Each destination goes through the
proxy's :class:`~sandbox.network.dial.Dialer`; a refusal is answered in the client's protocol and
recorded as a :class:`~sandbox.network.denial.Denial`.

In a tunnel the proxy reads the client's first bytes before any reach the server: a TLS
ClientHello whose SNI names another host is refused (``sni-mismatch``; TLS is never terminated),
plain HTTP is judged request by request, anything else (or a server that speaks first) is relayed
as it comes. Once a tunnel is set up its two sockets go to a :class:`~sandbox.network.relay.Relay`;
plain HTTP stays on the event loop.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import anyio
import anyio.from_thread
import anyio.to_thread

from sandbox.network.conn import HANDSHAKE_TIMEOUT
from sandbox.network.denial import Connected, Refused, where
from sandbox.network.http import (
    HEAD_LIMIT,
    Exchange,
    HttpRequest,
    comparable,
    http_refusal,
    http_response,
    relay_http,
    speaks_http,
    split_authority,
)
from sandbox.network.socks import socks_greeting, socks_refusal, socks_reply, socks_request
from sandbox.network.tls import NotClientHello, hello_sni

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from sandbox.network.broker import Broker
    from sandbox.network.conn import Conn
    from sandbox.network.denial import Denial
    from sandbox.network.dial import Dialer, Opened
    from sandbox.network.relay import Relays
    from sandbox.vocabulary import ProxyProtocol


TERMINATED_AT_ONCE = 128
"""Terminated connections served at once (each a thread); the proxy's own cap on connections is the same."""


class Clients:
    """How one proxy serves a client connection in each of its protocols.

    ``deny`` records a denial and ``connected`` reports a connection made (the proxy's, so its
    callbacks may change while it serves); ``relays`` takes over the tunnels set up.
    """

    def __init__(
        self,
        dialer: Dialer,
        relays: Relays,
        *,
        deny: Callable[[Denial], Awaitable[None]],
        connected: Callable[[Connected], Awaitable[None]],
        broker: Broker | None = None,
    ) -> None:
        self.dialer, self.relays = dialer, relays
        self.deny, self.connected = deny, connected
        self.broker = broker
        self._terminating: anyio.CapacityLimiter | None = None

    async def serve(self, client: Conn) -> None:
        """Tell the protocol by the first byte: SOCKS5 or HTTP."""
        with anyio.fail_after(HANDSHAKE_TIMEOUT):
            if not client.buffer:
                await client.fill()
        if client.buffer[0] == 0x05:
            await self._socks(client)
        else:
            await self.http(client)

    async def transparent_http(self, client: Conn) -> None:
        """A redirected HTTP connection: an ordinary request whose Host header names the destination."""
        await self.http(client, transparent=True)

    async def http(self, client: Conn, *, transparent: bool = False) -> None:
        try:
            with anyio.fail_after(HANDSHAKE_TIMEOUT):
                head = await client.read_until(b"\r\n\r\n", HEAD_LIMIT)
            client.settle()
            request = HttpRequest.parse(head)
            if request.method == "CONNECT" and transparent:
                raise ValueError("CONNECT on the transparent HTTP port: the jail has no proxy to talk to here")
            if request.method == "CONNECT":
                await self._http_connect(client, request)
            else:
                await self._http_forward(client, request, "transparent-http" if transparent else "http")
        except Refused as refused:
            await self.deny(refused.denial)
            await client.send_all(http_refusal(refused.denial))
        except ValueError as exc:
            await client.send_all(http_response("400 Bad Request", {}, f"sandbox: bad proxy request: {exc}\n"))

    async def open(self, host: str, port: int, protocol: ProxyProtocol) -> Opened:
        """A connection to the destination, reported as :class:`Connected`; :class:`Refused` says why not."""
        opened = await self.dialer.open(host, port)
        try:
            await self.connected(Connected(host, port, opened.address, opened.rule, protocol))
        except BaseException:
            opened.conn.close()
            raise
        return opened

    async def pass_on(self, client: Conn, upstream: Opened, host: str, port: int) -> None:
        """A TLS connection set up to ``host:port``: terminated when the broker names the host, else relayed."""
        if self._terminated(host, port):
            await self.terminate(client, upstream, host, port)
        else:
            await self.relay(client, upstream)

    def _terminated(self, host: str, port: int) -> bool:
        return self.broker is not None and self.broker.terminates(host, port)

    async def terminate(self, client: Conn, upstream: Opened, host: str, port: int) -> None:
        """Serve a terminated connection on a thread of its own (:func:`~sandbox.network.terminate.serve`)
        while this task keeps its place under the proxy's caps."""
        from sandbox.network.terminate import serve

        assert self.broker is not None
        if self._terminating is None:
            self._terminating = anyio.CapacityLimiter(TERMINATED_AT_ONCE)
        pending = client.take()
        if upstream.conn.buffer:  # a server that spoke first is no TLS server
            await self.deny(Refused(host, port, "bad-request", None, f"{where(host, port)} spoke before TLS").denial)
            return
        client_sock, server_sock = client.detach(), upstream.conn.detach()

        async def record(denial: Denial) -> None:
            await self.deny(denial)

        def deny(denial: Denial) -> None:
            with contextlib.suppress(RuntimeError):  # the proxy is closing: its loop takes no more
                anyio.from_thread.run(record, denial)

        try:
            with self.relays.hold(client_sock, server_sock):
                await anyio.to_thread.run_sync(
                    serve,
                    self.broker,
                    client_sock,
                    server_sock,
                    host,
                    port,
                    pending,
                    deny,
                    abandon_on_cancel=True,
                    limiter=self._terminating,
                )
        finally:
            client_sock.close()
            server_sock.close()

    async def relay(self, client: Conn, upstream: Opened) -> None:
        """Pass on what either side sent already, then hand both sockets to a relay of their own."""
        await upstream.conn.send_all(client.take())
        await client.send_all(upstream.conn.take())
        self.relays.start(client.detach(), upstream.conn.detach())

    async def _http_connect(self, client: Conn, request: HttpRequest) -> None:
        host, port = split_authority(request.target, None)
        upstream = await self.open(host, port, "connect")
        try:
            await client.send_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await self._tunnel(client, upstream, host, port)
        finally:
            upstream.conn.close()

    async def _http_forward(self, client: Conn, request: HttpRequest, protocol: ProxyProtocol) -> None:
        host, port, _path = request.destination()
        upstream = await self.open(host, port, protocol)
        try:
            await self._http_stream(client, upstream.conn, Exchange(host, port, rewrite=True), request)
        finally:
            upstream.conn.close()

    async def _http_stream(self, client: Conn, server: Conn, exchange: Exchange, first: HttpRequest | None) -> None:
        denial = await relay_http(client, server, exchange, first, self.dialer.policy)
        if denial is not None:
            await self.deny(denial)

    async def _socks(self, client: Conn) -> None:
        with anyio.fail_after(HANDSHAKE_TIMEOUT):
            if not await socks_greeting(client):
                return
            command, host, port = await socks_request(client)
        client.settle()
        try:
            if command != 0x01:
                raise Refused(host, port, "bad-request", None, f"SOCKS5 command {command} is not supported")
            upstream = await self.open(host, port, "socks5")
        except Refused as refused:
            await self.deny(refused.denial)
            await client.send_all(socks_refusal(refused.denial))
            return
        try:
            await client.send_all(socks_reply(0x00))
            await self._tunnel(client, upstream, host, port)
        finally:
            upstream.conn.close()

    async def _tunnel(self, client: Conn, upstream: Opened, host: str, port: int) -> None:
        """Check the client's first bytes before any reach the server, then relay: a TLS ClientHello's
        SNI must name the tunnel's host; plain HTTP is judged request by request (:func:`relay_http`).
        A host the broker terminates gets no byte unjudged: the proxy is its TLS server."""
        if self._terminated(host, port):
            await self.terminate(client, upstream, host, port)
            return
        if await _first_speaker(client, upstream.conn) is client:
            try:
                plain = not await _check_sni(client, host, port) and await speaks_http(client, host, port)
            except Refused as refused:
                await self.deny(refused.denial)
                return
            except EOFError:
                return
            if plain:
                exchange = Exchange(comparable(host), port, rewrite=False)
                await self._http_stream(client, upstream.conn, exchange, None)
                return
        await self.relay(client, upstream)


async def _first_speaker(client: Conn, server: Conn) -> Conn:
    """Whichever side sends first: TLS clients speak first, SMTP or SSH servers do."""
    if client.buffer or server.buffer:
        return client if client.buffer else server
    first: list[Conn] = []
    async with anyio.create_task_group() as tg:

        async def wait(conn: Conn) -> None:
            await anyio.wait_readable(conn.raw)
            first.append(conn)
            tg.cancel_scope.cancel()

        tg.start_soon(wait, client)
        tg.start_soon(wait, server)
    return first[0]


async def _check_sni(client: Conn, host: str, port: int) -> bool:
    """Read the client's ClientHello (if it sends TLS: ``True``) and refuse an SNI that names another host."""
    try:
        with anyio.fail_after(HANDSHAKE_TIMEOUT):
            sni = await hello_sni(client)
    except NotClientHello:
        return False
    except ValueError as exc:
        raise Refused(host, port, "bad-request", None, f"malformed TLS ClientHello: {exc}") from None
    if sni is not None and sni.rstrip(".").lower() != host.rstrip(".").lower():
        raise Refused(host, port, "sni-mismatch", None, f"the tunnel to {where(host, port)} carries TLS for {sni!r}")
    return True
