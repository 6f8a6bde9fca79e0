"""The egress proxy on loopback: CONNECT, plain HTTP and SOCKS5 against local servers.

Nothing here leaves 127.0.0.1: names resolve through a :class:`StaticResolver` (or, once, a tiny
DNS responder on loopback), the "servers" are an echo server, an HTTP server and a CONNECT proxy
started by the tests. A rebinding name such as ``metadata.test`` resolves to 169.254.169.254 but
is refused before any connection is tried, which the tests check.
"""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
import struct
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import anyio.abc
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream

from sandbox.network.denial import Connected, Denial
from sandbox.network.policy import EgressPolicy
from sandbox.network.proxy import EgressProxy
from sandbox.network.resolve import DnsResolver, StaticResolver
from tests.integration._loopback import WAIT, Approver, ProxyLab, on, serve, within

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

    from sandbox.vocabulary import Answer

pytestmark = pytest.mark.anyio
T = TypeVar("T")

NAMES = {
    "good.test": ["127.0.0.1"],
    "a.good.test": ["127.0.0.1"],
    "other.test": ["127.0.0.1"],
    "rebind.test": ["127.0.0.1"],
    "metadata.test": ["169.254.169.254"],
    "mixed.test": ["192.0.2.99", "127.0.0.1"],
}


# -- the local "internet" ---------------------------------------------------------------------------
@dataclass
class Server:
    """An echo server (optionally speaking first); each finished connection's bytes come out of ``finished``."""

    banner: bytes = b""
    port: int = 0
    send: MemoryObjectSendStream[bytes] = field(init=False)
    finished: MemoryObjectReceiveStream[bytes] = field(init=False)

    def __post_init__(self) -> None:
        self.send, self.finished = _memory_stream(bytes)

    async def handle(self, stream: anyio.abc.SocketStream) -> None:
        data = bytearray()
        try:
            if self.banner:
                await stream.send(self.banner)
            async for chunk in stream:
                data += chunk
                await stream.send(chunk)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass
        finally:
            await stream.aclose()
            self.send.send_nowait(bytes(data))


@dataclass
class HttpServer:
    """Answers one request per connection with ``hello``; the request heads come out of ``requests``."""

    port: int = 0
    send: MemoryObjectSendStream[bytes] = field(init=False)
    requests: MemoryObjectReceiveStream[bytes] = field(init=False)

    def __post_init__(self) -> None:
        self.send, self.requests = _memory_stream(bytes)

    async def handle(self, stream: anyio.abc.SocketStream) -> None:
        async with stream:
            reader = BufferedByteReceiveStream(stream)
            head = await reader.receive_until(b"\r\n\r\n", 65536)
            self.send.send_nowait(head)
            await stream.send(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello")


@dataclass
class UpstreamProxy:
    """A minimal CONNECT proxy standing for the executor's own; its targets come out of ``targets``."""

    table: dict[str, int]
    port: int = 0
    send: MemoryObjectSendStream[str] = field(init=False)
    targets: MemoryObjectReceiveStream[str] = field(init=False)

    def __post_init__(self) -> None:
        self.send, self.targets = _memory_stream(str)

    async def handle(self, stream: anyio.abc.SocketStream) -> None:
        async with stream:
            reader = BufferedByteReceiveStream(stream)
            head = (await reader.receive_until(b"\r\n\r\n", 65536)).decode()
            target = head.split(" ")[1]
            self.send.send_nowait(target)
            async with await anyio.connect_tcp("127.0.0.1", self.table[target]) as server:
                await stream.send(b"HTTP/1.1 200 OK\r\n\r\n")
                async with anyio.create_task_group() as tg:
                    tg.start_soon(_pipe, stream, server)
                    await _pipe(server, stream)


async def _pipe(source: anyio.abc.SocketStream, sink: anyio.abc.SocketStream) -> None:
    with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
        async for chunk in source:
            await sink.send(chunk)
        await sink.send_eof()


_OPEN: list[anyio.abc.AsyncResource] = []
"""Client streams and the servers' result streams, closed when the test's lab is torn down."""


def _memory_stream(_kind: type[T]) -> tuple[MemoryObjectSendStream[T], MemoryObjectReceiveStream[T]]:
    send, receive = anyio.create_memory_object_stream[T](100)
    _OPEN.extend((send, receive))
    return send, receive


@dataclass
class Lab(ProxyLab):
    NAMES = NAMES
    echo: Server
    banner: Server
    http: HttpServer
    tmp: Path
    closed_port: int

    def listeners(self) -> dict[str, Any]:
        return {"tcp": ("127.0.0.1", 0), "unix_path": self.tmp / "egress.sock"}


@pytest.fixture
async def lab(tmp_path: Path) -> AsyncIterator[Lab]:
    async with anyio.create_task_group() as tg:
        echo, banner, http = Server(), Server(banner=b"SSH-2.0-test\r\n"), HttpServer()
        echo.port, banner.port, http.port = (
            await serve(tg, echo.handle),
            await serve(tg, banner.handle),
            await serve(tg, http.handle),
        )
        with socket.socket() as unused:
            unused.bind(("127.0.0.1", 0))
            closed_port = unused.getsockname()[1]
        try:
            yield Lab(echo, banner, http, tmp_path, closed_port)
        finally:
            tg.cancel_scope.cancel()
            while _OPEN:
                await _OPEN.pop().aclose()


# -- clients ------------------------------------------------------------------------------------------
@dataclass
class Client:
    stream: anyio.abc.SocketStream
    reader: BufferedByteReceiveStream

    async def head(self) -> tuple[int, dict[str, str], bytes]:
        """Status, headers (lower-case names) and the body of a ``Connection: close`` response."""
        with anyio.fail_after(WAIT):
            raw = (await self.reader.receive_until(b"\r\n\r\n", 65536)).decode("latin-1").split("\r\n")
            headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in raw[1:])}
            length = int(headers.get("content-length", "0"))
            body = await self.reader.receive_exactly(length) if length else b""
        return int(raw[0].split(" ")[1]), headers, body

    async def echo(self, data: bytes) -> bytes:
        await self.stream.send(data)
        with anyio.fail_after(WAIT):
            return await self.reader.receive_exactly(len(data))

    async def rest(self) -> bytes:
        data = bytearray()
        with anyio.fail_after(WAIT), contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError):
            while True:
                data += await self.reader.receive()
        return bytes(data)


async def connect(proxy: EgressProxy) -> Client:
    address = proxy.tcp_address
    assert address is not None
    stream = await anyio.connect_tcp(*address)
    _OPEN.append(stream)
    return Client(stream, BufferedByteReceiveStream(stream))


async def tunnel(proxy: EgressProxy, target: str) -> tuple[Client, int, dict[str, str], bytes]:
    client = await connect(proxy)
    await client.stream.send(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    status, headers, body = await client.head()
    return client, status, headers, body


async def socks(proxy: EgressProxy, host: str | bytes, port: int) -> tuple[Client, int]:
    client = await connect(proxy)
    await client.stream.send(b"\x05\x01\x00")
    assert await within(client.reader.receive_exactly(2)) == b"\x05\x00"
    if isinstance(host, bytes):
        address = (b"\x01" if len(host) == 4 else b"\x04") + host
    else:
        address = b"\x03" + bytes([len(host)]) + host.encode()
    await client.stream.send(b"\x05\x01\x00" + address + struct.pack("!H", port))
    reply = await within(client.reader.receive_exactly(10))
    return client, reply[1]


def client_hello(server_name: str) -> bytes:
    context = ssl.create_default_context()
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname=server_name)
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


# -- CONNECT -----------------------------------------------------------------------------------------------
async def test_connect_allowed_relays_and_reports(lab: Lab) -> None:
    async with lab.proxy(on(lab.echo.port, "good.test")) as proxy:
        client, status, _, _ = await tunnel(proxy, f"good.test:{lab.echo.port}")
        assert status == 200
        assert await client.echo(b"ping") == b"ping"
        await client.stream.aclose()
    assert await within(lab.echo.finished.receive()) == b"ping"
    assert lab.connects == [
        Connected("good.test", lab.echo.port, f"127.0.0.1:{lab.echo.port}", f"good.test:{lab.echo.port}", "connect")
    ]
    assert lab.denials == []


async def test_connect_not_allowed_is_a_403_naming_host_port_reason(lab: Lab) -> None:
    async with lab.proxy(on(lab.echo.port, "good.test")) as proxy:
        _, status, headers, body = await tunnel(proxy, f"other.test:{lab.echo.port}")
    assert (status, headers["x-sandbox-denial"]) == (403, "not-allowed")
    assert f"other.test:{lab.echo.port}".encode() in body
    assert b"not-allowed" in body
    assert body.count(b"\n") == 1
    assert lab.denials == proxy.denials
    [denial] = lab.denials
    assert (denial.host, denial.port, denial.reason, denial.rule) == ("other.test", lab.echo.port, "not-allowed", None)
    assert "not on the allowlist" in denial.message
    assert lab.connects == []


async def test_deny_rule_wins_and_is_named(lab: Lab) -> None:
    async with lab.proxy(["*.good.test:443"], deny=["a.good.test"]) as proxy:
        _, status, headers, _ = await tunnel(proxy, "a.good.test:443")
    assert (status, headers["x-sandbox-denial"]) == (403, "denied")
    assert (lab.denials[0].reason, lab.denials[0].rule) == ("denied", "a.good.test")


async def test_wildcard_allows_subdomains_not_the_name(lab: Lab) -> None:
    port = lab.echo.port
    async with lab.proxy([f"*.good.test:{port}", f"127.0.0.1:{port}"]) as proxy:
        client, status, _, _ = await tunnel(proxy, f"a.good.test:{port}")
        assert status == 200
        assert await client.echo(b"sub") == b"sub"
        await client.stream.aclose()
        _, status, _, _ = await tunnel(proxy, f"good.test:{port}")
    assert status == 403
    assert [(d.host, d.reason) for d in lab.denials] == [("good.test", "not-allowed")]


async def test_port_rule_allows_only_its_port(lab: Lab) -> None:
    async with lab.proxy(on(lab.echo.port, "good.test")) as proxy:
        _, status, _, _ = await tunnel(proxy, f"good.test:{lab.banner.port}")
    assert status == 403
    assert (lab.denials[0].port, lab.denials[0].reason) == (lab.banner.port, "not-allowed")


async def test_large_transfer_both_ways_with_half_close(lab: Lab) -> None:
    payload = bytes(range(256)) * (16 * 1024)  # 4 MiB
    async with lab.proxy(on(lab.echo.port, "good.test")) as proxy:
        client, status, _, _ = await tunnel(proxy, f"good.test:{lab.echo.port}")
        assert status == 200
        async with anyio.create_task_group() as tg:

            async def send() -> None:
                await client.stream.send(payload)
                await client.stream.send_eof()  # the echo server sees EOF, closes, and the proxy passes that on

            tg.start_soon(send)
            echoed = await client.rest()
    assert echoed == payload
    assert await within(lab.echo.finished.receive()) == payload


async def test_server_that_speaks_first_works_through_a_tunnel(lab: Lab) -> None:
    async with lab.proxy(on(lab.banner.port, "good.test")) as proxy:
        client, status, _, _ = await tunnel(proxy, f"good.test:{lab.banner.port}")
        assert status == 200
        assert await within(client.reader.receive_exactly(14)) == b"SSH-2.0-test\r\n"
        assert await client.echo(b"SSH-2.0-client\r\n") == b"SSH-2.0-client\r\n"
        await client.stream.aclose()


async def test_unix_socket_is_served_and_removed_on_close(lab: Lab) -> None:
    path = lab.tmp / "egress.sock"
    async with lab.proxy(on(lab.echo.port, "good.test")):
        stream = await anyio.connect_unix(path)
        _OPEN.append(stream)
        client = Client(stream, BufferedByteReceiveStream(stream))
        target = f"good.test:{lab.echo.port}"
        await stream.send(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        assert (await client.head())[0] == 200
        assert await client.echo(b"via unix") == b"via unix"
        await stream.aclose()
    assert not path.exists()


# -- rebinding and addresses ------------------------------------------------------------------------------
async def test_name_resolving_to_loopback_is_refused_unless_the_address_is_allowed(lab: Lab) -> None:
    port = lab.echo.port
    async with lab.proxy([f"rebind.test:{port}"]) as proxy:
        _, status, headers, body = await tunnel(proxy, f"rebind.test:{port}")
    assert (status, headers["x-sandbox-denial"]) == (403, "private-address")
    assert b"127.0.0.1" in body
    assert (lab.denials[0].rule, lab.denials[0].reason) == (f"rebind.test:{port}", "private-address")
    async with lab.proxy([f"rebind.test:{port}", f"127.0.0.1:{port}"]) as proxy:
        client, status, _, _ = await tunnel(proxy, f"rebind.test:{port}")
        assert status == 200
        assert await client.echo(b"ok") == b"ok"
        await client.stream.aclose()


async def test_name_resolving_to_the_metadata_service_is_refused(lab: Lab) -> None:
    async with lab.proxy(["metadata.test"]) as proxy:
        _, status, headers, body = await tunnel(proxy, "metadata.test:80")
    assert (status, headers["x-sandbox-denial"]) == (403, "private-address")
    assert b"169.254.169.254" in body
    assert b"cloud-metadata" in body


async def test_one_special_address_among_several_refuses_the_name(lab: Lab) -> None:
    async with lab.proxy(["mixed.test:80", "192.0.2.99:80"]) as proxy:
        _, status, _, body = await tunnel(proxy, "mixed.test:80")
    assert status == 403
    assert b"127.0.0.1" in body


async def test_ip_literal_needs_an_address_rule(lab: Lab) -> None:
    port = lab.echo.port
    async with lab.proxy([f"good.test:{port}"]) as proxy:
        _, status, _, _ = await tunnel(proxy, f"127.0.0.1:{port}")
    assert status == 403
    async with lab.proxy([f"127.0.0.0/8:{port}"]) as proxy:
        client, status, _, _ = await tunnel(proxy, f"127.0.0.1:{port}")
        assert status == 200
        assert await client.echo(b"literal") == b"literal"
        await client.stream.aclose()
    assert lab.connects[-1].rule == f"127.0.0.0/8:{port}"


async def test_unknown_name_is_resolve_failed_502(lab: Lab) -> None:
    async with lab.proxy(["nowhere.test"]) as proxy:
        _, status, headers, _ = await tunnel(proxy, "nowhere.test:443")
    assert (status, headers["x-sandbox-denial"]) == (502, "resolve-failed")


async def test_closed_port_is_connect_failed_502(lab: Lab) -> None:
    async with lab.proxy(on(lab.closed_port, "good.test")) as proxy:
        _, status, headers, _ = await tunnel(proxy, f"good.test:{lab.closed_port}")
    assert (status, headers["x-sandbox-denial"]) == (502, "connect-failed")


# -- SNI ------------------------------------------------------------------------------------------------
async def test_sni_matching_the_tunnel_is_relayed(lab: Lab) -> None:
    hello = client_hello("good.test")
    async with lab.proxy(on(lab.echo.port, "good.test")) as proxy:
        client, status, _, _ = await tunnel(proxy, f"good.test:{lab.echo.port}")
        assert status == 200
        assert await client.echo(hello) == hello
        await client.stream.aclose()
    assert await within(lab.echo.finished.receive()) == hello


async def test_sni_naming_another_host_is_refused_before_the_server_sees_a_byte(lab: Lab) -> None:
    async with lab.proxy(on(lab.echo.port, "good.test")) as proxy:
        client, status, _, _ = await tunnel(proxy, f"good.test:{lab.echo.port}")
        assert status == 200
        await client.stream.send(client_hello("evil.example"))
        assert await client.rest() == b""
    assert await within(lab.echo.finished.receive()) == b""
    [denial] = lab.denials
    assert (denial.reason, denial.host) == ("sni-mismatch", "good.test")
    assert "evil.example" in denial.message


async def test_sni_is_checked_in_socks_tunnels_too(lab: Lab) -> None:
    async with lab.proxy(on(lab.echo.port, "good.test")) as proxy:
        client, code = await socks(proxy, "good.test", lab.echo.port)
        assert code == 0
        await client.stream.send(client_hello("other.test"))
        assert await client.rest() == b""
    assert lab.denials[0].reason == "sni-mismatch"


# -- plain HTTP ---------------------------------------------------------------------------------------------
async def test_http_forward_rewrites_to_origin_form(lab: Lab) -> None:
    port = lab.http.port
    async with lab.proxy(on(port, "good.test")) as proxy:
        client = await connect(proxy)
        request = (
            f"GET http://good.test:{port}/path?q=1 HTTP/1.1\r\nHost: good.test:{port}\r\n"
            "Proxy-Connection: keep-alive\r\nProxy-Authorization: Basic eDp5\r\nAccept: */*\r\n\r\n"
        )
        await client.stream.send(request.encode())
        status, _, body = await client.head()
    assert (status, body) == (200, b"hello")
    head = (await within(lab.http.requests.receive())).decode()
    assert head.startswith("GET /path?q=1 HTTP/1.1\r\n")
    assert f"Host: good.test:{port}\r\n" in head
    assert head.endswith("\r\nConnection: close")  # receive_until drops the blank line
    assert "Proxy-" not in head
    assert "Accept: */*" in head
    assert lab.connects[0].protocol == "http"


async def test_http_forward_denied_is_a_403_with_the_header(lab: Lab) -> None:
    async with lab.proxy(on(lab.http.port, "good.test")) as proxy:
        client = await connect(proxy)
        await client.stream.send(b"GET http://other.test/ HTTP/1.1\r\nHost: other.test\r\n\r\n")
        status, headers, body = await client.head()
    assert (status, headers["x-sandbox-denial"]) == (403, "not-allowed")
    assert b"other.test:80" in body


async def test_http_host_header_must_agree_with_the_uri(lab: Lab) -> None:
    port = lab.http.port
    async with lab.proxy(on(port, "good.test", "other.test")) as proxy:
        client = await connect(proxy)
        await client.stream.send(f"GET http://good.test:{port}/ HTTP/1.1\r\nHost: other.test:{port}\r\n\r\n".encode())
        status, headers, _ = await client.head()
    assert (status, headers["x-sandbox-denial"]) == (403, "host-mismatch")


async def test_https_uri_and_garbage_are_bad_requests(lab: Lab) -> None:
    async with lab.proxy(["good.test"]) as proxy:
        client = await connect(proxy)
        await client.stream.send(b"GET https://good.test/ HTTP/1.1\r\nHost: good.test\r\n\r\n")
        assert (await client.head())[0] == 400
        client = await connect(proxy)
        await client.stream.send(b"HELLO\r\n\r\n")
        assert (await client.head())[0] == 400
    assert lab.denials == []


# -- SOCKS5 --------------------------------------------------------------------------------------------
async def test_socks5_resolves_names_remotely(lab: Lab) -> None:
    async with lab.proxy(on(lab.echo.port, "good.test")) as proxy:
        client, code = await socks(proxy, "good.test", lab.echo.port)
        assert code == 0x00
        assert await client.echo(b"socks") == b"socks"
        await client.stream.aclose()
    assert lab.connects[0].protocol == "socks5"


async def test_socks5_refusal_is_reply_code_2(lab: Lab) -> None:
    async with lab.proxy([*on(lab.echo.port, "good.test"), "metadata.test"]) as proxy:
        _, code = await socks(proxy, "other.test", lab.echo.port)
        _, rebound = await socks(proxy, "metadata.test", 443)
    assert (code, rebound) == (0x02, 0x02)
    assert [d.reason for d in lab.denials] == ["not-allowed", "private-address"]


async def test_socks5_ip_literals(lab: Lab) -> None:
    port = lab.echo.port
    async with lab.proxy([f"127.0.0.1:{port}"]) as proxy:
        client, code = await socks(proxy, socket.inet_aton("127.0.0.1"), port)
        assert code == 0
        assert await client.echo(b"v4") == b"v4"
        await client.stream.aclose()
        _, code = await socks(proxy, socket.inet_pton(socket.AF_INET6, "::1"), port)
    assert code == 0x02
    assert (lab.denials[0].host, lab.denials[0].reason) == ("::1", "not-allowed")


# -- ask ---------------------------------------------------------------------------------------------------
async def test_ask_allow_once_asks_again_next_time(lab: Lab) -> None:
    approver, port = Approver("allow-once"), lab.echo.port
    async with lab.proxy([f"127.0.0.1:{port}"], ask=True, approver=approver) as proxy:
        for _ in range(2):
            client, status, _, _ = await tunnel(proxy, f"good.test:{port}")
            assert status == 200
            await client.stream.aclose()
    assert approver.asked == [("good.test", port), ("good.test", port)]
    assert lab.connects[0].rule == "ask:allow-once"


async def test_ask_allow_session_is_remembered(lab: Lab) -> None:
    approver, port = Approver("allow-session"), lab.echo.port
    async with lab.proxy([f"127.0.0.1:{port}"], ask=True, approver=approver) as proxy:
        for _ in range(2):
            client, status, _, _ = await tunnel(proxy, f"good.test:{port}")
            assert status == 200
            await client.stream.aclose()
    assert approver.asked == [("good.test", port)]


async def test_ask_deny(lab: Lab) -> None:
    async with lab.proxy([], ask=True, approver=Approver("deny")) as proxy:
        _, status, headers, _ = await tunnel(proxy, "good.test:443")
    assert (status, headers["x-sandbox-denial"]) == (403, "ask-denied")


async def test_ask_approved_name_still_gets_the_address_check(lab: Lab) -> None:
    async with lab.proxy([], ask=True, approver=Approver("allow-once")) as proxy:
        _, status, headers, _ = await tunnel(proxy, "metadata.test:80")
    assert (status, headers["x-sandbox-denial"]) == (403, "private-address")


async def test_ask_timeout_denies(lab: Lab) -> None:
    never = anyio.Event()

    async def silent(_host: str, _port: int) -> Answer:
        await never.wait()
        return "allow-once"

    async with lab.proxy([], ask=True, approver=silent, ask_timeout=0.2) as proxy:
        _, status, headers, body = await tunnel(proxy, "good.test:443")
    assert (status, headers["x-sandbox-denial"]) == (403, "ask-timeout")
    assert b"0.2 s" in body


async def test_ask_without_approver_or_with_a_failing_one_denies(lab: Lab) -> None:
    async def broken(_host: str, _port: int) -> Answer:
        raise RuntimeError("the pipe is closed")

    async with lab.proxy([], ask=True) as proxy:
        _, status, _, _ = await tunnel(proxy, "good.test:443")
    async with lab.proxy([], ask=True, approver=broken) as proxy:
        _, again, _, _ = await tunnel(proxy, "good.test:443")
    assert (status, again) == (403, 403)
    assert [d.reason for d in lab.denials] == ["ask-unavailable", "ask-unavailable"]


async def test_no_ask_means_no_question(lab: Lab) -> None:
    approver = Approver("allow-session")
    async with lab.proxy([], approver=approver) as proxy:
        _, status, _, _ = await tunnel(proxy, "good.test:443")
    assert (status, approver.asked) == (403, [])


# -- upstream chaining -------------------------------------------------------------------------------------
async def test_upstream_proxy_is_chained_by_name(lab: Lab) -> None:
    port = lab.echo.port
    upstream = UpstreamProxy({f"good.test:{port}": port, f"good.test:{lab.http.port}": lab.http.port})
    async with anyio.create_task_group() as tg:
        upstream.port = await serve(tg, upstream.handle)
        options: dict[str, Any] = {"upstream": f"http://127.0.0.1:{upstream.port}", "resolver": StaticResolver({})}
        async with lab.proxy([f"good.test:{port}", f"good.test:{lab.http.port}"], **options) as proxy:
            client, status, _, _ = await tunnel(proxy, f"good.test:{port}")
            assert status == 200
            assert await client.echo(b"chained") == b"chained"
            await client.stream.aclose()
            _, refused, _, _ = await tunnel(proxy, f"other.test:{port}")
            web = await connect(proxy)
            await web.stream.send(f"GET http://good.test:{lab.http.port}/x HTTP/1.1\r\n\r\n".encode())
            assert (await web.head())[2] == b"hello"
        tg.cancel_scope.cancel()
    assert (await within(lab.http.requests.receive())).startswith(b"GET /x HTTP/1.1\r\nHost: good.test:")
    assert refused == 403
    targets = [await within(upstream.targets.receive()) for _ in range(2)]
    assert targets == [f"good.test:{port}", f"good.test:{lab.http.port}"]
    assert upstream.targets.statistics().current_buffer_used == 0  # the refused one never reached it
    assert lab.connects[0].address == f"via upstream 127.0.0.1:{upstream.port}"


# -- lifecycle ---------------------------------------------------------------------------------------------
async def test_closing_the_proxy_closes_relayed_clients(lab: Lab) -> None:
    async with lab.proxy(on(lab.echo.port, "good.test")) as proxy:
        client, status, _, _ = await tunnel(proxy, f"good.test:{lab.echo.port}")
        assert await client.echo(b"before") == b"before"
        address = proxy.tcp_address
        assert address is not None
    with anyio.fail_after(5):
        assert await client.rest() == b""
        assert await within(lab.echo.finished.receive()) == b"before"
    with pytest.raises(ConnectionRefusedError), socket.create_connection(address):
        pass


def test_serve_in_thread_for_a_synchronous_caller(tmp_path: Path) -> None:
    denials: list[Denial] = []
    policy = EgressPolicy.from_patterns(["good.test"])
    proxy = EgressProxy(policy, unix_path=tmp_path / "p.sock", resolver=StaticResolver(NAMES), on_denial=denials.append)
    handle = proxy.serve_in_thread()
    try:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.connect(str(tmp_path / "p.sock"))
            sock.sendall(b"CONNECT other.test:443 HTTP/1.1\r\nHost: other.test:443\r\n\r\n")
            response = sock.makefile("rb").read()
    finally:
        handle.close()
    assert response.startswith(b"HTTP/1.1 403 ")
    assert b"X-Sandbox-Denial: not-allowed\r\n" in response
    assert [d.host for d in denials] == ["other.test"] == [d.host for d in handle.denials]
    assert not (tmp_path / "p.sock").exists()


def test_a_connection_handed_over_by_descriptor_is_proxied_and_anything_else_is_dropped(tmp_path: Path) -> None:
    """What a jail's forwarder does (``--copy pass``): one zero byte and the client's socket."""
    denials: list[Denial] = []
    policy = EgressPolicy.from_patterns(["good.test"])
    path = tmp_path / "p.sock"
    handle = EgressProxy(
        policy, unix_path=path, resolver=StaticResolver(NAMES), on_denial=denials.append
    ).serve_in_thread()
    try:
        ours, theirs = socket.socketpair()
        with ours, socket.socket(socket.AF_UNIX) as carrier:
            carrier.connect(str(path))
            socket.send_fds(carrier, [b"\0"], [theirs.fileno()])
            theirs.close()
            ours.sendall(b"CONNECT other.test:443 HTTP/1.1\r\nHost: other.test:443\r\n\r\n")
            response = ours.makefile("rb").read()
        assert response.startswith(b"HTTP/1.1 403 ") and [d.host for d in denials] == ["other.test"]
        read_end, write_end = os.pipe()  # not a socket: the proxy closes it and the carrier, nothing else
        with socket.socket(socket.AF_UNIX) as carrier:
            carrier.connect(str(path))
            socket.send_fds(carrier, [b"\0"], [read_end])
            os.close(read_end)
            carrier.settimeout(WAIT)
            assert carrier.recv(1) == b""
        with pytest.raises(BrokenPipeError):
            _fill(write_end)  # the proxy's copy of the read end is closed too: no reader is left
        os.close(write_end)
    finally:
        handle.close()


def _fill(fd: int) -> None:
    for _ in range(64):
        os.write(fd, b"x" * 65536)


# -- dnspython against a DNS responder on loopback ---------------------------------------------------------------
def dns_answer(query: bytes, table: dict[str, str]) -> bytes:
    """A reply to a one-question query: A records from ``table``, NXDOMAIN for other names."""
    labels, offset = [], 12
    while query[offset]:
        labels.append(query[offset + 1 : offset + 1 + query[offset]].decode())
        offset += 1 + query[offset]
    question_end = offset + 5
    qtype = int.from_bytes(query[offset + 1 : offset + 3], "big")
    name = ".".join(labels).lower()
    address = table.get(name)
    answers = b""
    if address is not None and qtype == 1:
        answers = b"\xc0\x0c" + struct.pack("!HHIH", 1, 1, 60, 4) + socket.inet_aton(address)
    flags = 0x8180 if address is not None else 0x8183
    header = query[:2] + struct.pack("!HHHHH", flags, 1, 1 if answers else 0, 0, 0)
    return header + query[12:question_end] + answers


async def test_dns_resolver_and_the_proxy_against_a_loopback_dns_server(lab: Lab) -> None:
    table = {"good.test": "127.0.0.1", "metadata.test": "169.254.169.254"}
    async with await anyio.create_udp_socket(local_host="127.0.0.1") as udp, anyio.create_task_group() as tg:

        async def respond() -> None:
            async for packet, sender in udp:
                await udp.sendto(dns_answer(packet, table), *sender)

        tg.start_soon(respond)
        resolver = DnsResolver("127.0.0.1", udp.extra(anyio.abc.SocketAttribute.local_port), timeout=5)
        assert [str(a) for a in await resolver.resolve("good.test")] == ["127.0.0.1"]
        assert await resolver.resolve("nowhere.test") == []
        port = lab.echo.port
        async with lab.proxy(on(port, "good.test") + ["metadata.test"], resolver=resolver) as proxy:
            client, status, _, _ = await tunnel(proxy, f"good.test:{port}")
            assert status == 200
            await client.stream.aclose()
            _, refused, headers, _ = await tunnel(proxy, "metadata.test:443")
        assert (refused, headers["x-sandbox-denial"]) == (403, "private-address")
        tg.cancel_scope.cancel()
