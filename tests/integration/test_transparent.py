"""Transparent mode's host side on loopback: the TLS and HTTP listeners, and the filtering DNS server.

Connections arrive as a jail's DNAT rules deliver them: no proxy protocol, the destination named
only by the TLS server name or the Host header. The "internet" is a TLS echo server holding a
throw-away self-signed certificate for ``good.test``, an HTTP server, and the names of a
:class:`StaticResolver`. Nothing leaves 127.0.0.1: the listeners bound to 192.0.2.x (an address
no host has) only show that ``IP_FREEBIND`` lets them bind; nothing connects there.
"""

from __future__ import annotations

import contextlib
import datetime
import socket
import ssl
from dataclasses import astuple, dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import dns.asyncquery
import dns.message
import dns.query
import dns.rcode
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream
from anyio.streams.tls import TLSAttribute, TLSStream
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from sandbox.network.dnsfilter import FilteringDns
from sandbox.network.policy import EgressPolicy
from sandbox.network.proxy import EgressProxy
from sandbox.network.resolve import StaticResolver
from tests.integration._loopback import WAIT, Approver, ProxyLab, on, serve, within

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from sandbox.network.denial import Denial

pytestmark = pytest.mark.anyio
SILENCE = 0.5
"""How long a DNS client waits to conclude that no answer is coming (the one wait for an absence)."""

NAMES = {
    "good.test": ["127.0.0.1"],
    "other.test": ["127.0.0.1"],
    "metadata.test": ["169.254.169.254"],
}
UNASSIGNED = "192.0.2.1"
"""TEST-NET-1: an address no interface of this host has, to bind with ``IP_FREEBIND``."""


# -- the local "internet" -------------------------------------------------------------------------------
def self_signed(tmp: Path, name: str) -> tuple[Path, Path]:
    """A throw-away certificate for ``name`` and its key, as PEM files."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp / f"{name}.crt", tmp / f"{name}.key"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


@dataclass
class TlsServer:
    """A TLS echo server; the server names its clients asked for come out of ``names``."""

    context: ssl.SSLContext
    port: int = 0
    names: list[str | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.context.sni_callback = self._sni

    def _sni(self, _tls: ssl.SSLObject, name: str | None, _context: ssl.SSLContext) -> None:
        self.names.append(name)

    async def handle(self, stream: anyio.abc.SocketStream) -> None:
        async with stream:
            with contextlib.suppress(ssl.SSLError, anyio.BrokenResourceError, anyio.EndOfStream):
                tls = await TLSStream.wrap(
                    stream, server_side=True, ssl_context=self.context, standard_compatible=False
                )
                async for chunk in tls:
                    await tls.send(chunk)


@dataclass
class HttpServer:
    """Answers one request per connection with ``hello``; the request heads are kept in ``requests``."""

    port: int = 0
    requests: list[bytes] = field(default_factory=list)

    async def handle(self, stream: anyio.abc.SocketStream) -> None:
        async with stream:
            head = await BufferedByteReceiveStream(stream).receive_until(b"\r\n\r\n", 65536)
            self.requests.append(head)
            await stream.send(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello")


@dataclass
class Lab(ProxyLab):
    NAMES = NAMES
    tls: TlsServer
    http: HttpServer
    client_context: ssl.SSLContext

    def listeners(self) -> dict[str, Any]:
        """Only the transparent listeners; TLS is taken to the TLS server's port."""
        return {
            "transparent_http": ("127.0.0.1", 0),
            "transparent_tls": ("127.0.0.1", 0),
            "transparent_tls_port": self.tls.port,
        }


@pytest.fixture
async def lab(tmp_path: Path) -> AsyncIterator[Lab]:
    cert, key = self_signed(tmp_path, "good.test")
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(cert, key)
    client_context = ssl.create_default_context(cafile=str(cert))
    async with anyio.create_task_group() as tg:
        tls, http = TlsServer(server_context), HttpServer()
        tls.port, http.port = await serve(tg, tls.handle), await serve(tg, http.handle)
        try:
            yield Lab(tls, http, client_context)
        finally:
            tg.cancel_scope.cancel()


# -- the TLS listener -----------------------------------------------------------------------------------
@contextlib.asynccontextmanager
async def tls_client(proxy: EgressProxy, context: ssl.SSLContext, name: str | None) -> AsyncIterator[TLSStream]:
    """A TLS connection to ``name`` made as a jail's would arrive: to the transparent listener."""
    address = proxy.transparent_tls_address
    assert address is not None
    async with await anyio.connect_tcp(*address) as stream:
        wrapping = TLSStream.wrap(
            stream, server_side=False, hostname=name, ssl_context=context, standard_compatible=False
        )
        yield await within(wrapping)


async def echo(tls: TLSStream, data: bytes) -> bytes:
    await tls.send(data)
    received = bytearray()
    with anyio.fail_after(WAIT):
        while len(received) < len(data):
            received += await tls.receive()
    return bytes(received)


async def test_tls_to_an_allowed_name_is_relayed_end_to_end(lab: Lab) -> None:
    port = lab.tls.port
    async with lab.proxy(on(port, "good.test")) as proxy, tls_client(proxy, lab.client_context, "good.test") as tls:
        assert await echo(tls, b"ping through an untouched TLS session") == b"ping through an untouched TLS session"
        certificate = tls.extra(TLSAttribute.peer_certificate)
        assert certificate is not None and certificate["subject"] == ((("commonName", "good.test"),),)
    assert lab.tls.names == ["good.test"]
    assert [astuple(c) for c in lab.connects] == [
        ("good.test", port, f"127.0.0.1:{port}", f"good.test:{port}", "transparent-tls")
    ]
    assert lab.denials == []


async def test_tls_to_a_refused_name_gets_an_alert_and_a_denial(lab: Lab) -> None:
    port = lab.tls.port
    async with lab.proxy(on(port, "good.test")) as proxy:
        with pytest.raises(ssl.SSLError, match="ACCESS_DENIED"):
            async with tls_client(proxy, lab.client_context, "other.test"):
                pass
    assert [(d.host, d.port, d.reason) for d in lab.denials] == [("other.test", port, "not-allowed")]
    assert lab.connects == [] and lab.tls.names == []


async def test_tls_without_a_server_name_is_a_bad_request(lab: Lab) -> None:
    anonymous = ssl.create_default_context()
    anonymous.check_hostname, anonymous.verify_mode = False, ssl.CERT_NONE
    async with lab.proxy(on(lab.tls.port, "good.test")) as proxy:
        with pytest.raises(ssl.SSLError, match="ACCESS_DENIED"):
            async with tls_client(proxy, anonymous, None):
                pass
    [denial] = lab.denials
    assert denial.reason == "bad-request" and "SNI" in denial.message
    assert lab.connects == [] and lab.tls.names == []


async def test_bytes_that_are_not_tls_are_a_bad_request(lab: Lab) -> None:
    async with lab.proxy(on(lab.tls.port, "good.test")) as proxy:
        address = proxy.transparent_tls_address
        assert address is not None
        async with await anyio.connect_tcp(*address) as stream:
            await stream.send(b"GET / HTTP/1.1\r\nHost: good.test\r\n\r\n")
            reply = await within(BufferedByteReceiveStream(stream).receive_exactly(7))
    assert reply[:1] == b"\x15"  # an alert record, then the end
    assert [d.reason for d in lab.denials] == ["bad-request"]
    assert "ClientHello" in lab.denials[0].message


async def test_tls_name_resolving_to_the_metadata_service_is_refused(lab: Lab) -> None:
    port = lab.tls.port
    async with lab.proxy([f"metadata.test:{port}"]) as proxy:
        with pytest.raises(ssl.SSLError, match="ACCESS_DENIED"):
            async with tls_client(proxy, lab.client_context, "metadata.test"):
                pass
    assert [(d.host, d.reason) for d in lab.denials] == [("metadata.test", "private-address")]


async def test_tls_ask_allow_and_deny(lab: Lab) -> None:
    port = lab.tls.port
    allow, deny = Approver("allow-once"), Approver("deny")
    async with (
        lab.proxy([f"127.0.0.1:{port}"], ask=True, approver=allow) as proxy,
        tls_client(proxy, lab.client_context, "good.test") as tls,
    ):
        assert await echo(tls, b"asked") == b"asked"
    async with lab.proxy([f"127.0.0.1:{port}"], ask=True, approver=deny) as proxy:
        with pytest.raises(ssl.SSLError, match="ACCESS_DENIED"):
            async with tls_client(proxy, lab.client_context, "good.test"):
                pass
    assert allow.asked == deny.asked == [("good.test", port)]
    assert lab.connects[0].rule == "ask:allow-once"
    assert [d.reason for d in lab.denials] == ["ask-denied"]


class BioClient:
    """A TLS client over memory buffers: the test decides how its bytes go on the wire."""

    def __init__(self, context: ssl.SSLContext, name: str) -> None:
        self.incoming, self.outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.tls = context.wrap_bio(self.incoming, self.outgoing, server_hostname=name)

    def hello(self) -> bytes:
        with pytest.raises(ssl.SSLWantReadError):
            self.tls.do_handshake()
        return self.outgoing.read()

    async def finish(self, stream: anyio.abc.SocketStream) -> None:
        while True:
            try:
                self.tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                await self._flush(stream)
                self.incoming.write(await within(stream.receive()))
        await self._flush(stream)

    async def echo(self, stream: anyio.abc.SocketStream, data: bytes) -> bytes:
        self.tls.write(data)
        await self._flush(stream)
        received = b""
        while len(received) < len(data):
            try:
                received += self.tls.read(65536)
            except ssl.SSLWantReadError:
                self.incoming.write(await within(stream.receive()))
        return received

    async def _flush(self, stream: anyio.abc.SocketStream) -> None:
        if data := self.outgoing.read():
            await stream.send(data)


def split_records(record: bytes, at: int) -> tuple[bytes, bytes]:
    """One TLS handshake record as two, the message cut at ``at`` (what a large ClientHello looks like)."""
    header, payload = record[:3], record[5:]
    assert record[0] == 0x16 and len(payload) == int.from_bytes(record[3:5], "big") > at
    first, second = payload[:at], payload[at:]
    return (
        header + len(first).to_bytes(2, "big") + first,
        header + len(second).to_bytes(2, "big") + second,
    )


async def test_a_client_hello_across_records_and_segments_is_read_whole(lab: Lab) -> None:
    port = lab.tls.port
    client = BioClient(lab.client_context, "good.test")
    first, second = split_records(client.hello(), 40)  # the server name is in the second record
    async with lab.proxy(on(port, "good.test")) as proxy:
        address = proxy.transparent_tls_address
        assert address is not None
        async with await anyio.connect_tcp(*address) as stream:
            await stream.send(first[:3])  # a partial record header, then the rest: each send is a segment
            await stream.send(first[3:])
            await stream.send(second)
            await client.finish(stream)
            assert await client.echo(stream, b"whole") == b"whole"
    assert lab.tls.names == ["good.test"] and lab.denials == []


# -- the HTTP listener ----------------------------------------------------------------------------------
async def transparent_get(proxy: EgressProxy, head: str) -> tuple[int, dict[str, str], bytes]:
    """Send ``head`` (an origin-form request) to the transparent HTTP listener; status, headers, body."""
    address = proxy.transparent_http_address
    assert address is not None
    async with await anyio.connect_tcp(*address) as stream:
        await stream.send(head.encode())
        reader = BufferedByteReceiveStream(stream)
        with anyio.fail_after(WAIT):
            raw = (await reader.receive_until(b"\r\n\r\n", 65536)).decode("latin-1").split("\r\n")
            headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in raw[1:])}
            body = await reader.receive_exactly(int(headers.get("content-length", "0")))
    return int(raw[0].split(" ")[1]), headers, body


async def test_http_is_routed_by_its_host_header(lab: Lab) -> None:
    port = lab.http.port
    async with lab.proxy(on(port, "good.test")) as proxy:
        status, _, body = await transparent_get(proxy, f"GET /x?y=1 HTTP/1.1\r\nHost: good.test:{port}\r\n\r\n")
    assert (status, body) == (200, b"hello")
    [request] = lab.http.requests
    assert request.startswith(f"GET /x?y=1 HTTP/1.1\r\nHost: good.test:{port}\r\n".encode())
    assert request.endswith(b"\r\nConnection: close")
    assert [astuple(c) for c in lab.connects] == [
        ("good.test", port, f"127.0.0.1:{port}", f"good.test:{port}", "transparent-http")
    ]


async def test_http_to_a_refused_host_is_a_403_with_the_header(lab: Lab) -> None:
    port = lab.http.port
    async with lab.proxy(on(port, "good.test")) as proxy:
        status, headers, body = await transparent_get(proxy, f"GET / HTTP/1.1\r\nHost: other.test:{port}\r\n\r\n")
    assert (status, headers["x-sandbox-denial"]) == (403, "not-allowed")
    assert f"other.test:{port}".encode() in body
    assert [(d.host, d.port, d.reason) for d in lab.denials] == [("other.test", port, "not-allowed")]
    assert lab.http.requests == []


async def test_http_host_without_a_port_means_80_and_loopback_needs_its_own_rule(lab: Lab) -> None:
    async with lab.proxy(["good.test"]) as proxy:
        status, headers, _ = await transparent_get(proxy, "GET / HTTP/1.1\r\nHost: good.test\r\n\r\n")
    assert (status, headers["x-sandbox-denial"]) == (403, "private-address")
    assert [(d.host, d.port) for d in lab.denials] == [("good.test", 80)]
    assert lab.connects == []


async def test_http_rebinding_name_is_refused_unless_its_address_is_allowed(lab: Lab) -> None:
    port = lab.http.port
    head = f"GET / HTTP/1.1\r\nHost: good.test:{port}\r\n\r\n"
    async with lab.proxy([f"good.test:{port}"]) as proxy:
        refused, headers, _ = await transparent_get(proxy, head)
    async with lab.proxy(on(port, "good.test")) as proxy:
        allowed, _, _ = await transparent_get(proxy, head)
    assert (refused, headers["x-sandbox-denial"], allowed) == (403, "private-address", 200)


async def test_http_ask_allow_and_deny(lab: Lab) -> None:
    port = lab.http.port
    head = f"GET / HTTP/1.1\r\nHost: good.test:{port}\r\n\r\n"
    async with lab.proxy([f"127.0.0.1:{port}"], ask=True, approver=Approver("allow-once")) as proxy:
        allowed, _, _ = await transparent_get(proxy, head)
    async with lab.proxy([f"127.0.0.1:{port}"], ask=True, approver=Approver("deny")) as proxy:
        denied, headers, _ = await transparent_get(proxy, head)
    assert (allowed, denied, headers["x-sandbox-denial"]) == (200, 403, "ask-denied")


async def test_http_without_host_or_with_connect_is_a_bad_request(lab: Lab) -> None:
    port = lab.http.port
    async with lab.proxy(on(port, "good.test")) as proxy:
        no_host, _, _ = await transparent_get(proxy, "GET / HTTP/1.1\r\n\r\n")
        connect, _, body = await transparent_get(proxy, f"CONNECT good.test:{port} HTTP/1.1\r\n\r\n")
    assert (no_host, connect) == (400, 400)
    assert b"CONNECT" in body
    assert lab.http.requests == [] and lab.connects == []


# -- binding --------------------------------------------------------------------------------------------
async def test_transparent_listeners_bind_an_address_no_interface_has_yet() -> None:
    policy = EgressPolicy.from_patterns([])
    proxy = EgressProxy(policy, transparent_http=(UNASSIGNED, 0), transparent_tls=(UNASSIGNED, 0))
    async with proxy, FilteringDns(policy, StaticResolver({}), bind=(UNASSIGNED, 0)) as dns_server:
        bound = [proxy.transparent_http_address, proxy.transparent_tls_address, dns_server.address]
        assert proxy.tcp_address is None
    assert all(address is not None and address[0] == UNASSIGNED and address[1] for address in bound)
    assert len(set(bound)) == 3


# -- the filtering DNS server ---------------------------------------------------------------------------
@contextlib.asynccontextmanager
async def dns_lab(allow: list[str], denials: list[Denial]) -> AsyncIterator[tuple[str, int]]:
    policy = EgressPolicy.from_patterns(allow)
    server = FilteringDns(policy, StaticResolver(NAMES), bind=("127.0.0.1", 0), on_denial=denials.append)
    async with server:
        assert server.address is not None
        yield server.address


@pytest.mark.parametrize("transport", ["udp", "tcp"])
async def test_dns_over_udp_and_tcp(transport: str) -> None:
    denials: list[Denial] = []
    query = dns.asyncquery.udp if transport == "udp" else dns.asyncquery.tcp
    async with dns_lab(["good.test", "127.0.0.1", "metadata.test"], denials) as (host, port):

        async def ask(name: str, rdtype: str = "A") -> dns.message.Message:
            return await query(dns.message.make_query(name, rdtype), host, port=port, timeout=WAIT)

        good, other, metadata, mx = (
            await ask("good.test"),
            await ask("other.test"),
            await ask("metadata.test"),
            await ask("good.test", "MX"),
        )
    assert (good.rcode(), [r.to_text() for rrset in good.answer for r in rrset]) == (dns.rcode.NOERROR, ["127.0.0.1"])
    assert (other.rcode(), other.answer) == (dns.rcode.REFUSED, [])
    assert (metadata.rcode(), metadata.answer) == (dns.rcode.NOERROR, [])
    assert (mx.rcode(), mx.answer) == (dns.rcode.NOERROR, [])
    assert [(d.host, d.port, d.reason) for d in denials] == [
        ("other.test", 53, "not-allowed"),
        ("metadata.test", 53, "private-address"),
    ]


async def test_dns_garbage_over_udp_gets_no_answer_and_the_server_goes_on() -> None:
    async with dns_lab(["good.test", "127.0.0.1"], []) as (host, port), await udp_client(host, port) as udp:
        await udp.send(b"\x12\x34 this is not a DNS message")
        with anyio.move_on_after(SILENCE) as silence:
            await udp.receive()
        assert silence.cancelled_caught, "the server answered a garbage packet"
        query = dns.message.make_query("good.test", "A")
        await udp.send(query.to_wire())
        reply = dns.message.from_wire(await within(udp.receive()))
    assert (reply.id, reply.rcode(), len(reply.answer)) == (query.id, dns.rcode.NOERROR, 1)


async def udp_client(host: str, port: int) -> anyio.abc.ConnectedUDPSocket:
    return await anyio.create_connected_udp_socket(host, port)


@pytest.mark.parametrize("sent", [b"\x00\x11not a DNS message", b"\x13\x88"], ids=["garbage", "over-4096"])
async def test_dns_garbage_or_an_oversized_query_over_tcp_closes_the_connection(sent: bytes) -> None:
    async with dns_lab(["good.test"], []) as (host, port), await anyio.connect_tcp(host, port) as stream:
        await stream.send(sent)
        with pytest.raises(anyio.EndOfStream):
            await within(stream.receive())


def test_dns_runs_beside_the_proxy_on_its_thread() -> None:
    """How the executor runs both: one thread, one event loop, one record of denials."""
    policy = EgressPolicy.from_patterns(["good.test"])
    proxy = EgressProxy(policy, transparent_tls=("127.0.0.1", 0), resolver=StaticResolver(NAMES))
    with proxy.serve_in_thread() as handle:
        server = handle.run_beside(FilteringDns.beside(proxy, bind=("127.0.0.1", 0)))
        assert server.address is not None
        host, port = server.address
        reply = dns.query.udp(dns.message.make_query("other.test", "A"), host, port=port, timeout=WAIT)
        assert reply.rcode() == dns.rcode.REFUSED
        assert [d.host for d in handle.denials] == ["other.test"]
    assert server.address is None
    with pytest.raises(ConnectionRefusedError), socket.create_connection((host, port), timeout=WAIT):
        pass
