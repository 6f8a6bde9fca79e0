"""Issue 31's network attacks: the allowlist proxy judged by what a hostile jail sends, not by its first request.

- Category 10, every request is checked: a second request on a plain HTTP connection (pipelined or
  kept alive) or plain HTTP inside a CONNECT tunnel that names another host never reaches the
  server; the connection closes and a denial is recorded. Ambiguous framing (smuggling) is refused.
- Category 6, nothing leaks before a question is answered: in ``ask`` mode and in transparent
  mode's DNS, a name no rule allows reaches no resolver (a counting DNS server on loopback) until
  the user allows it, and never when the user denies or no one can be asked.
- Category 4, the proxy half: a session's proxy holds a bounded number of pending handshakes and
  connections; past either a clean refusal (503, SOCKS failure) and an ``over-limit`` denial, while
  another session's proxy serves on.
- Category 7, the proxy's socket: in a directory only the jail's user (or group) can enter.

The proxy-level attacks run on loopback (servers, resolver and proxies of the test's own); the jail
attacks run on every backend of the matrix, the servers on the host's loopback, reached only through
the proxy. Nothing here reaches any other address.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import dns.message
import dns.rcode
import dns.rdatatype
import dns.rrset
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream

from sandbox import exec as executor
from sandbox.network import proxy as proxy_module
from sandbox.network.conn import Conn
from sandbox.network.denial import Denial, Refused
from sandbox.network.dnsfilter import FilteringDns
from sandbox.network.egress import Egress
from sandbox.network.http import speaks_http
from sandbox.network.policy import EgressPolicy
from sandbox.network.proxy import EgressProxy
from sandbox.network.resolve import DnsResolver, StaticResolver
from tests.attack.conftest import mode_profile
from tests.integration._loopback import WAIT, Approver, serve, within
from tests.integration.test_proxy import client_hello

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Iterator
    from pathlib import Path

    from sandbox.vocabulary import Answer
    from tests.conftest import JailFactory

pytestmark = pytest.mark.anyio

NAMES = {"good.test": ["127.0.0.1"], "evil.test": ["127.0.0.1"]}
QUIET = 0.5
"""How long a test waits to conclude that nothing more arrives (the one wait for an absence)."""
HANDSHAKES = int(getattr(proxy_module, "MAX_HANDSHAKES", 32))
"""A session's proxy's cap on connections that have not sent their request (32 by default)."""
STALL_S = float(getattr(proxy_module, "HANDSHAKE_STALL_S", 0.0))
"""How long a silent connection waits before it counts against that cap."""


# -- the local "internet": a keep-alive HTTP server that answers everything, a counting resolver ----------
@dataclass
class KeepAliveServer:
    """Answers every request of a connection, ``Connection: close`` or not (as a lax or hostile
    server would): the heads it was sent are in ``heads``, the bodies in ``bodies``."""

    port: int = 0
    heads: list[bytes] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)

    async def handle(self, stream: anyio.abc.SocketStream) -> None:
        async with stream:
            reader = BufferedByteReceiveStream(stream)
            with contextlib.suppress(anyio.EndOfStream, anyio.IncompleteRead, anyio.BrokenResourceError):
                while True:
                    head = await reader.receive_until(b"\r\n\r\n", 65536)
                    self.heads.append(head)
                    self.bodies.append(await _body(reader, head))
                    await stream.send(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    def hosts(self) -> list[str]:
        return [_host_of(head) for head in self.heads]


async def _body(reader: BufferedByteReceiveStream, head: bytes) -> bytes:
    lower = head.lower()
    if b"transfer-encoding: chunked" in lower:
        return await reader.receive_until(b"0\r\n\r\n", 65536) + b"0\r\n\r\n"
    for line in lower.split(b"\r\n"):
        if line.startswith(b"content-length:"):
            return await reader.receive_exactly(int(line.split(b":")[1]))
    return b""


def _host_of(head: bytes) -> str:
    for line in head.decode("latin-1").split("\r\n")[1:]:
        name, _, value = line.partition(":")
        if name.lower() == "host":
            return value.strip()
    return ""


@dataclass
class CountingDns:
    """A UDP DNS server on loopback answering every A question with 127.0.0.1; ``asked`` is what it was asked."""

    port: int = 0
    asked: list[str] = field(default_factory=list)

    async def run(self, sock: anyio.abc.UDPSocket) -> None:
        async for packet, sender in sock:
            query = dns.message.from_wire(packet)
            question = query.question[0]
            self.asked.append(question.name.to_text(omit_final_dot=True))
            response = dns.message.make_response(query)
            if question.rdtype == dns.rdatatype.A:
                response.answer.append(dns.rrset.from_text_list(question.name, 5, "IN", "A", ["127.0.0.1"]))
            await sock.sendto(response.to_wire(), *sender)


@dataclass
class Net:
    """The test's servers and the proxies it starts, recording their denials here."""

    http: KeepAliveServer
    echo_port: int
    dns: CountingDns
    tmp: Path
    tg: anyio.abc.TaskGroup
    denials: list[Denial] = field(default_factory=list)

    @contextlib.asynccontextmanager
    async def proxy(self, allow: list[str], **options: Any) -> AsyncIterator[EgressProxy]:
        policy = EgressPolicy.from_patterns(allow, ask=options.pop("ask", False))
        options.setdefault("resolver", StaticResolver(NAMES))
        async with EgressProxy(policy, tcp=("127.0.0.1", 0), on_denial=self.denials.append, **options) as proxy:
            yield proxy


@pytest.fixture
async def net(tmp_path: Path) -> AsyncIterator[Net]:
    async with anyio.create_task_group() as tg:
        http = KeepAliveServer()
        http.port = await serve(tg, http.handle)
        echo_port = await serve(tg, _echo)
        counting = CountingDns()
        udp = await anyio.create_udp_socket(local_host="127.0.0.1")
        counting.port = udp.extra(anyio.abc.SocketAttribute.local_port)
        tg.start_soon(counting.run, udp)
        try:
            yield Net(http, echo_port, counting, tmp_path, tg)
        finally:
            tg.cancel_scope.cancel()
            await udp.aclose()


async def _echo(stream: anyio.abc.SocketStream) -> None:
    async with stream:
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
            async for chunk in stream:
                await stream.send(chunk)


def on(port: int, *names: str) -> list[str]:
    return [f"{name}:{port}" for name in names] + [f"127.0.0.1:{port}"]


async def talk(proxy: EgressProxy, data: bytes, *, closed: bool = True) -> bytes:
    """Send ``data`` to the proxy and read until it closes the connection; ``closed=False``: or
    until a quiet moment (the keep-alive server keeps a connection the proxy lets stay)."""
    address = proxy.tcp_address
    assert address is not None
    async with await anyio.connect_tcp(*address) as stream:
        await stream.send(data)
        return await _until_closed(stream, closed=closed)


async def _until_closed(stream: anyio.abc.SocketStream, quiet: float = 2.0, *, closed: bool = True) -> bytes:
    received = bytearray()
    with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError):
        while True:
            with anyio.move_on_after(quiet if closed else QUIET) as idle:
                received += await stream.receive()
            if idle.cancelled_caught and closed:
                raise AssertionError(f"the proxy kept the connection open; received {bytes(received)[:200]!r}")
            if idle.cancelled_caught:
                break
    return bytes(received)


def reasons(net: Net) -> list[tuple[str, str]]:
    return [(d.host, d.reason) for d in net.denials]


# -- category 10: every request on a connection is judged ----------------------------------------------------
async def test_pipelined_request_for_another_host_never_reaches_the_server(net: Net) -> None:
    port = net.http.port
    first = f"GET http://good.test:{port}/one HTTP/1.1\r\nHost: good.test:{port}\r\n\r\n"
    second = "GET /two HTTP/1.1\r\nHost: evil.test\r\n\r\n"
    async with net.proxy(on(port, "good.test")) as proxy:
        await talk(proxy, (first + second).encode())
    assert net.http.hosts() == [f"good.test:{port}"]
    assert reasons(net) == [("evil.test", "not-allowed")]


async def test_kept_alive_absolute_form_request_for_another_host_closes_the_connection(net: Net) -> None:
    port = net.http.port
    async with net.proxy(on(port, "good.test")) as proxy:
        address = proxy.tcp_address
        assert address is not None
        async with await anyio.connect_tcp(*address) as stream:
            await stream.send(f"GET http://good.test:{port}/ HTTP/1.1\r\nHost: good.test:{port}\r\n\r\n".encode())
            reader = BufferedByteReceiveStream(stream)
            assert (await within(reader.receive_until(b"ok", 4096))).startswith(b"HTTP/1.1 200")
            await stream.send(f"GET http://evil.test:{port}/ HTTP/1.1\r\nHost: evil.test:{port}\r\n\r\n".encode())
            assert await _until_closed(stream) == b""
    assert net.http.hosts() == [f"good.test:{port}"]
    assert reasons(net) == [("evil.test", "not-allowed")]


async def test_the_client_is_told_the_connection_closes_when_the_server_is_asked_to(net: Net) -> None:
    """Issue 32: the proxy asks the server to close after a forwarded request; a client that pools its
    connections (npm) must hear it too, or it sends its next request on a closing connection and
    gets ECONNRESET. Said even when the server's own answer says nothing of it (or says keep-alive)."""
    port = net.http.port
    ask = f"GET http://good.test:{port}/ HTTP/1.1\r\nHost: good.test:{port}\r\nConnection: keep-alive\r\n\r\n"
    async with net.proxy(on(port, "good.test")) as proxy:
        answer = await talk(proxy, ask.encode(), closed=False)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and body == b"ok", answer
    assert head.lower().count(b"connection:") == 1 and head.endswith(b"\r\nConnection: close"), head
    assert net.http.heads[0].endswith(b"\r\nConnection: close")  # and the server was asked to close


async def test_an_allowed_second_host_on_the_same_connection_is_refused_too(net: Net) -> None:
    """One destination per connection: the connection was opened to good.test's address, not to the other's."""
    port = net.http.port
    first = f"GET http://good.test:{port}/ HTTP/1.1\r\n\r\n"
    second = f"GET http://evil.test:{port}/ HTTP/1.1\r\n\r\n"
    async with net.proxy(on(port, "good.test", "evil.test")) as proxy:
        await talk(proxy, (first + second).encode())
    assert net.http.hosts() == [f"good.test:{port}"]
    assert reasons(net) == [("evil.test", "host-mismatch")]


async def test_plain_http_inside_a_connect_tunnel_is_judged_request_by_request(net: Net) -> None:
    port = net.http.port
    target = f"good.test:{port}"
    good = f"GET / HTTP/1.1\r\nHost: {target}\r\n\r\n"
    evil = "GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n"
    async with net.proxy(on(port, "good.test")) as proxy:
        address = proxy.tcp_address
        assert address is not None
        async with await anyio.connect_tcp(*address) as stream:
            reader = BufferedByteReceiveStream(stream)
            await stream.send(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
            assert (await within(reader.receive_until(b"\r\n\r\n", 4096))).startswith(b"HTTP/1.1 200")
            for _ in range(2):  # kept alive: each request for the tunnel's own host is answered
                await stream.send(good.encode())
                assert (await within(reader.receive_until(b"ok", 4096))).startswith(b"HTTP/1.1 200")
            await stream.send(evil.encode())
            assert await _until_closed(stream) == b""
    assert net.http.hosts() == [target, target]
    assert reasons(net) == [("evil.test", "not-allowed")]


@pytest.mark.parametrize(
    "smuggled",
    [
        # A body framed two ways: which one the server believes decides where its next request starts.
        "Content-Length: 0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET / HTTP/1.1\r\nHost: evil.test\r\n\r\n",
        "Content-Length: 0\r\nContent-Length: 40\r\n\r\nGET / HTTP/1.1\r\nHost: evil.test\r\n\r\n",
        # A bare LF, which lenient servers read as a line end: a Host header this parser would not see.
        "X-Pad: 1\nHost: evil.test\n\r\n\r\n",
    ],
    ids=["te-and-cl", "two-lengths", "bare-lf"],
)
async def test_ambiguous_requests_are_refused_before_anything_is_sent(net: Net, smuggled: str) -> None:
    port = net.http.port
    async with net.proxy(on(port, "good.test")) as proxy:
        answer = await talk(proxy, f"POST http://good.test:{port}/ HTTP/1.1\r\n{smuggled}".encode())
    assert answer.startswith(b"HTTP/1.1 400"), answer
    assert net.http.heads == []


async def test_a_chunked_body_is_relayed_and_what_follows_it_is_judged(net: Net) -> None:
    port = net.http.port
    body = "5\r\nhello\r\n0\r\n\r\n"
    first = f"POST http://good.test:{port}/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n{body}"
    async with net.proxy(on(port, "good.test")) as proxy:
        await talk(proxy, (first + "GET http://evil.test/ HTTP/1.1\r\n\r\n").encode())
    assert net.http.bodies == [body.encode()]
    assert reasons(net) == [("evil.test", "not-allowed")]


async def test_plain_http_inside_a_socks_tunnel_is_judged_too(net: Net) -> None:
    port = net.http.port
    good = f"GET / HTTP/1.1\r\nHost: good.test:{port}\r\n\r\n"  # the SOCKS name as sent, in another case
    evil = "GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n"
    async with net.proxy(on(port, "good.test")) as proxy:
        address = proxy.tcp_address
        assert address is not None
        async with await anyio.connect_tcp(*address) as stream:
            reader = BufferedByteReceiveStream(stream)
            await stream.send(b"\x05\x01\x00")
            assert await within(reader.receive_exactly(2)) == b"\x05\x00"
            name = b"Good.Test"
            await stream.send(b"\x05\x01\x00\x03" + bytes([len(name)]) + name + port.to_bytes(2, "big"))
            assert (await within(reader.receive_exactly(10)))[1] == 0
            await stream.send(good.encode())
            assert (await within(reader.receive_until(b"ok", 4096))).startswith(b"HTTP/1.1 200")
            await stream.send(evil.encode())
            assert await _until_closed(stream) == b""
    assert net.http.hosts() == [f"good.test:{port}"]
    assert reasons(net) == [("evil.test", "not-allowed")]


async def test_a_tunnel_to_port_80_must_carry_http() -> None:
    """Port 80 is plain HTTP's: a client there that does not begin a request is refused, not relayed."""
    ours, theirs = socket.socketpair()
    with ours, theirs:
        conn = Conn(ours)
        conn.buffer += b"\r\nSSH-2.0-not-http\r\n"
        with pytest.raises(Refused) as refused:
            await speaks_http(conn, "good.test", 80)
        assert refused.value.denial.reason == "bad-request"
        conn.buffer[:] = b"\r\nGET / HTTP/1.1\r\n"
        assert await speaks_http(conn, "good.test", 80)
        conn.buffer[:] = b"\x00binary"
        assert not await speaks_http(conn, "good.test", 5432)  # elsewhere: relayed as it comes


async def test_a_protocol_other_than_http_still_passes_a_tunnel_off_port_80(net: Net) -> None:
    """Judging HTTP in tunnels must not break other protocols: an echo server's bytes go through."""
    target = f"good.test:{net.echo_port}"
    async with net.proxy(on(net.echo_port, "good.test")) as proxy:
        address = proxy.tcp_address
        assert address is not None
        async with await anyio.connect_tcp(*address) as stream:
            await stream.send(f"CONNECT {target} HTTP/1.1\r\n\r\n".encode())
            reader = BufferedByteReceiveStream(stream)
            assert (await within(reader.receive_until(b"\r\n\r\n", 4096))).startswith(b"HTTP/1.1 200")
            await stream.send(b"\x00binary hello")
            assert await within(reader.receive_exactly(13)) == b"\x00binary hello"
    assert net.denials == []


# -- category 6: nothing reaches a resolver before the user answers ---------------------------------------------
@pytest.mark.parametrize("answer", ["deny", None], ids=["denied", "unattended"])
async def test_ask_mode_proxy_resolves_nothing_the_user_has_not_allowed(net: Net, answer: Answer | None) -> None:
    approver = Approver(answer) if answer is not None else None
    resolver = DnsResolver("127.0.0.1", net.dns.port, timeout=2)
    async with net.proxy([], ask=True, resolver=resolver, approver=approver) as proxy:
        reply = await talk(proxy, b"CONNECT unknown.test:443 HTTP/1.1\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 403")
    assert net.dns.asked == []


async def test_transparent_dns_asks_no_resolver_about_a_name_not_yet_allowed(net: Net) -> None:
    policy = EgressPolicy.from_patterns([], ask=True)
    resolver = DnsResolver("127.0.0.1", net.dns.port, timeout=2)
    async with FilteringDns(policy, resolver, bind=("127.0.0.1", 0)) as server:
        for rdtype in ("A", "AAAA", "MX"):
            query = dns.message.make_query("unknown.test", rdtype)
            wire = await server.reply(query.to_wire(), udp=True)
            assert wire is not None and dns.message.from_wire(wire).rcode() == dns.rcode.NOERROR
        await anyio.sleep(QUIET)
    assert net.dns.asked == []


async def test_transparent_tls_resolves_only_after_the_user_allows(net: Net) -> None:
    """The connection after the lookup is where the user is asked: denied, still no query; allowed, one."""
    resolver = DnsResolver("127.0.0.1", net.dns.port, timeout=2)
    cases: list[tuple[Answer, list[str]]] = [("deny", []), ("allow-once", ["unknown.test"])]
    for answer, queried in cases:
        options: dict[str, Any] = {"transparent_tls_port": net.echo_port, "approver": Approver(answer)}
        policy = EgressPolicy.from_patterns([f"127.0.0.1:{net.echo_port}"], ask=True)
        tls = EgressProxy(
            policy, transparent_tls=("127.0.0.1", 0), resolver=resolver, on_denial=net.denials.append, **options
        )
        async with tls:
            where = tls.transparent_tls_address
            assert where is not None
            async with await anyio.connect_tcp(*where) as stream:
                await stream.send(client_hello("unknown.test"))
                with contextlib.suppress(AssertionError):
                    await _until_closed(stream, quiet=1.0)
        assert sorted(set(net.dns.asked)) == queried, answer


# -- category 4: caps per session, a clean refusal past them ---------------------------------------------------
async def _idle_connections(proxy: EgressProxy, count: int) -> list[anyio.abc.SocketStream]:
    address = proxy.tcp_address
    assert address is not None
    return [await anyio.connect_tcp(*address) for _ in range(count)]


def _pending(proxy: EgressProxy) -> int:
    """The proxy's count of unfinished handshakes (a proxy without caps has none to show: it waits for nothing)."""
    return int(getattr(proxy, "handshakes", 1 << 30))


async def _settled(proxy: EgressProxy, handshakes: int) -> None:
    """Until ``handshakes`` connections are pending, and silent long enough to count as stalled."""
    with anyio.fail_after(WAIT):
        while _pending(proxy) < handshakes:
            await anyio.sleep(0.01)
    await anyio.sleep(STALL_S + 0.05)


async def test_a_burst_of_fresh_connections_is_not_a_slowloris(net: Net) -> None:
    """Issue 32: npm 9 opens some 40 connections at once, each sending its request within
    milliseconds; a cap on connections that have not sent theirs *yet* refused the burst (and the
    install). Silent connections count only once overdue: the burst is served whole."""
    port = net.http.port
    request = f"GET http://good.test:{port}/ HTTP/1.1\r\nHost: good.test:{port}\r\n\r\n".encode()
    async with net.proxy(on(port, "good.test")) as proxy:
        burst = await _idle_connections(proxy, HANDSHAKES * 3 // 2)
        try:
            await _settled_fresh(proxy, len(burst))
            for stream in burst:
                await stream.send(request)
            for stream in burst:
                reader = BufferedByteReceiveStream(stream)
                assert (await within(reader.receive_until(b"ok", 4096))).startswith(b"HTTP/1.1 200")
        finally:
            for stream in burst:
                await stream.aclose()
    assert reasons(net) == []


async def _settled_fresh(proxy: EgressProxy, handshakes: int) -> None:
    """Until ``handshakes`` connections are pending (admitted, none yet overdue)."""
    with anyio.fail_after(WAIT):
        while _pending(proxy) < handshakes:
            await anyio.sleep(0.01)


async def test_slowloris_past_the_handshake_cap_is_refused_and_another_session_serves_on(net: Net) -> None:
    port = net.http.port
    cap = HANDSHAKES
    request = f"GET http://good.test:{port}/ HTTP/1.1\r\n\r\n".encode()
    async with net.proxy(on(port, "good.test")) as hostile, net.proxy(on(port, "good.test")) as other:
        idle = await _idle_connections(hostile, cap)  # connections that never finish their request line
        try:
            await _settled(hostile, cap)
            refused = await talk(hostile, request)
            assert refused.startswith(b"HTTP/1.1 503"), refused
            assert b"X-Sandbox-Denial: over-limit" in refused
            assert (await talk(other, request, closed=False)).startswith(b"HTTP/1.1 200")  # another session's
        finally:
            for stream in idle:
                await stream.aclose()
        with anyio.fail_after(WAIT):
            while _pending(hostile) and _pending(hostile) < 1 << 30:
                await anyio.sleep(0.01)
        assert (await talk(hostile, request, closed=False)).startswith(b"HTTP/1.1 200")  # places given back
    assert ("(connection limit)", "over-limit") in reasons(net)


async def test_socks_past_the_cap_gets_a_socks_failure(net: Net) -> None:
    async with net.proxy(on(net.echo_port, "good.test"), max_handshakes=2) as proxy:
        idle = await _idle_connections(proxy, 2)
        try:
            await _settled(proxy, 2)
            assert await talk(proxy, b"\x05\x01\x00") == b"\x05\xff"
        finally:
            for stream in idle:
                await stream.aclose()


async def test_connections_past_the_cap_are_refused_while_tunnels_are_relayed(net: Net) -> None:
    target = f"good.test:{net.echo_port}"
    async with net.proxy(on(net.echo_port, "good.test"), max_connections=3, queue_wait=0.2) as proxy:
        tunnels = []
        try:
            tunnels.extend([await _tunnel(proxy, target) for _ in range(3)])
            address = proxy.tcp_address
            assert address is not None
            refused = await talk(proxy, f"CONNECT {target} HTTP/1.1\r\n\r\n".encode())
            assert refused.startswith(b"HTTP/1.1 503"), refused
        finally:
            for stream in tunnels:
                await stream.aclose()
    assert reasons(net) == [("(connection limit)", "over-limit")]


async def test_a_burst_past_the_connection_cap_waits_its_turn(net: Net) -> None:
    """Issue 32: npm 9 through a proxy opens one connection per request, hundreds at once. Past
    the cap a connection waits in the listener's backlog (costing no descriptor here) for a place,
    and is served when one frees; only a cap still full after ``queue_wait`` refuses."""
    port = net.http.port
    request = f"GET http://good.test:{port}/ HTTP/1.1\r\nHost: good.test:{port}\r\n\r\n".encode()
    answers: list[bytes] = []

    async def one(proxy: EgressProxy) -> None:
        answers.append(await _answer(proxy, request))

    async with net.proxy(on(port, "good.test"), max_connections=3) as proxy, anyio.create_task_group() as tg:
        for _ in range(12):
            tg.start_soon(one, proxy)
    assert len(answers) == 12 and all(answer.startswith(b"HTTP/1.1 200") for answer in answers), answers
    assert reasons(net) == []


async def _answer(proxy: EgressProxy, request: bytes) -> bytes:
    """The head and body of the answer to ``request`` (the keep-alive server never closes), then close."""
    address = proxy.tcp_address
    assert address is not None
    async with await anyio.connect_tcp(*address) as stream:
        await stream.send(request)
        reader = BufferedByteReceiveStream(stream)
        return await within(reader.receive_until(b"ok", 4096))


async def _tunnel(proxy: EgressProxy, target: str) -> anyio.abc.SocketStream:
    address = proxy.tcp_address
    assert address is not None
    stream = await anyio.connect_tcp(*address)
    await stream.send(f"CONNECT {target} HTTP/1.1\r\n\r\n".encode())
    reader = BufferedByteReceiveStream(stream)
    assert (await within(reader.receive_until(b"\r\n\r\n", 4096))).startswith(b"HTTP/1.1 200")
    await stream.send(b"x")
    assert await within(reader.receive_exactly(1)) == b"x"  # relayed: the proxy holds it as a connection
    return stream


# -- category 7: the proxy's socket is the jail's user's only -------------------------------------------------
def _connect_as_nobody(path: Path) -> int:
    """Exit status of a child running as ``nobody`` that connects to ``path`` (0: it could)."""
    code = f"import socket; socket.socket(socket.AF_UNIX).connect({str(path)!r})"
    done = subprocess.run(
        ["/usr/bin/python3", "-c", code], user=65534, group=65534, extra_groups=[], capture_output=True, check=False
    )
    return done.returncode


@pytest.mark.root
def test_the_proxys_socket_is_not_reachable_by_another_local_user() -> None:
    from sandbox.profile_tables import Network

    egress = Egress.start(Network(mode="allowlist", allow=("good.test",)))
    try:
        folder = egress.socket_dir
        assert folder is not None
        assert folder.stat().st_mode & 0o777 == 0o700
        assert _connect_as_nobody(folder / "proxy.sock") != 0
        with socket.socket(socket.AF_UNIX) as ours:  # ours can
            ours.connect(str(folder / "proxy.sock"))
    finally:
        egress.close()


# -- the same attacks from inside a jail, on every backend ------------------------------------------------------
JAIL_CLIENT = r"""
import os, socket, sys, time
PROXY = int(os.environ["http_proxy"].rsplit(":", 1)[1])  # the forwarder's, or (Landlock) the proxy's own port
def talk(data, n=1):
    conns = [socket.create_connection(("127.0.0.1", PROXY)) for _ in range(n - 1)]
    if conns:
        time.sleep(float(sys.argv[3]))  # the idle ones arrive (the forwarder's threads) and fall overdue
    s = socket.create_connection(("127.0.0.1", PROXY))
    conns.append(s)
    s.sendall(data)
    s.settimeout(3)
    got = b""
    try:
        while chunk := s.recv(65536):
            got += chunk
    except OSError:
        got += b" [open]"
    for c in conns:
        c.close()
    return got
port = int(sys.argv[1])
plain = f"GET http://127.0.0.1:{port}/one HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n"
plain += "GET /two HTTP/1.1\r\nHost: evil.test\r\n\r\n"
print("plain", talk(plain.encode()).count(b"HTTP/1.1 200"))
tunnel = f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\nGET / HTTP/1.1\r\nHost: evil.test\r\n\r\n"
print("tunnel", talk(tunnel.encode()).count(b"HTTP/1.1 200"))
print("flood", talk(f"GET http://127.0.0.1:{port}/ HTTP/1.1\r\n\r\n".encode(), n=int(sys.argv[2]) + 1)[:12].decode())
"""


async def test_a_jail_cannot_smuggle_requests_nor_flood_its_proxy(open_jail: JailFactory, net: Net) -> None:
    port = net.http.port
    profile = mode_profile("ro", **{"network.mode": "allowlist", "network.allow": [f"127.0.0.1:{port}"]})
    jail = await open_jail(profile)
    script = ["python3", "-c", JAIL_CLIENT, str(port), str(HANDSHAKES), str(STALL_S + 1.0)]
    result = await executor.run(jail, script, timeout=60)
    assert result.exit_code == 0, result
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    # The first plain request is answered (the second may race the close); the tunnel's own 200 only.
    assert lines["plain"] in ("0", "1") and lines["tunnel"] == "1", result.stdout
    assert lines["flood"] == "HTTP/1.1 503", result.stdout
    assert net.http.hosts() == [f"127.0.0.1:{port}"]  # nothing for evil.test reached the server
    assert result.network is not None
    found = {(d["host"], d["reason"]) for d in result.network["denials"]}
    assert {("evil.test", "not-allowed"), ("(connection limit)", "over-limit")} <= found, found


@pytest.mark.root
async def test_a_jails_proxy_socket_admits_the_jail_and_not_another_user(open_jail: JailFactory, net: Net) -> None:
    port = net.http.port
    profile = mode_profile("ro", **{"network.mode": "allowlist", "network.allow": [f"127.0.0.1:{port}"]})
    jail = await open_jail(profile)
    fetch = (
        "import os, socket; port = int(os.environ['http_proxy'].rsplit(':', 1)[1]);"
        "s = socket.create_connection(('127.0.0.1', port)); s.settimeout(10);"
        f"s.sendall(b'GET http://127.0.0.1:{port}/ HTTP/1.1\\r\\n\\r\\n'); print(s.recv(15).decode())"
    )
    result = await executor.run(jail, ["python3", "-c", fetch], timeout=60)
    assert result.stdout.strip() == "HTTP/1.1 200 OK", result.stderr  # the jail's user reaches its proxy
    egress = jail.egress
    assert egress is not None and egress.socket_dir is not None
    assert egress.socket_dir.stat().st_mode & 0o007 == 0  # nothing for others
    assert _connect_as_nobody(egress.socket_dir / "proxy.sock") != 0


async def test_the_proxy_survives_emfile_without_spinning(net: Net, caplog: pytest.LogCaptureFixture) -> None:
    """With the process's descriptor table full, the pending connection waits in the backlog; the
    accept loop neither dies nor spins (a warning per pause), and serves it once descriptors free up."""
    port = net.http.port
    request = f"GET http://good.test:{port}/ HTTP/1.1\r\n\r\n".encode()
    async with net.proxy(on(port, "good.test")) as proxy:
        address = proxy.tcp_address
        assert address is not None
        with _descriptors_exhausted(spare=1) as release:
            stream = await anyio.connect_tcp(*address)  # the last descriptor: the proxy's accept gets EMFILE
            await anyio.sleep(QUIET)
            release()
        async with stream:
            await stream.send(request)
            assert (await _until_closed(stream, closed=False)).startswith(b"HTTP/1.1 200")
    pauses = [r for r in caplog.records if "accept failed" in r.getMessage()]
    assert len(pauses) in range(1, int(QUIET / 0.05) + 3), len(pauses)  # paused, and not spinning


@contextlib.contextmanager
def _descriptors_exhausted(spare: int) -> Iterator[Callable[[], None]]:
    """Fill this process's descriptor table but ``spare`` entries (under a lowered soft limit)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    held: list[int] = []

    def release() -> None:
        while held:
            os.close(held.pop())
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 64, hard))
    try:
        with contextlib.suppress(OSError):
            while True:
                held.append(os.open("/dev/null", os.O_RDONLY))
        for _ in range(spare):
            os.close(held.pop())
        yield release
    finally:
        release()
