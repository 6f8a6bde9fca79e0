"""Hypothesis against the egress proxy's request parsing (issue 31): garbage is refused, never a crash.

Two levels. The HTTP head parser alone: it accepts a head or raises ``ValueError`` (or the proxy's
refusal), and what it accepts holds no CR, LF or NUL anywhere a lenient server could read another
line from, and passes on exactly what it judged. The whole proxy on loopback, with a policy that
allows nothing: whatever bytes a client sends (HTTP-ish, SOCKS5-ish or random), the proxy answers
with a refusal or closes, logs no unexpected exception, connects nowhere, and keeps serving.
"""

from __future__ import annotations

import contextlib
import logging

import anyio
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from sandbox.network.denial import Refused as _Refused
from sandbox.network.http import HttpRequest as _Request
from sandbox.network.policy import EgressPolicy
from sandbox.network.proxy import EgressProxy
from sandbox.network.resolve import StaticResolver
from sandbox.network.tls import IncompleteHello, NotClientHello, client_hello_sni

pytestmark = pytest.mark.anyio

PIECES = st.sampled_from(
    ["GET", "CONNECT", "POST", " ", "\r\n", "\n", "\r", "\0", ":", "Host", "host", "evil.test", "good.test:80",
     "http://good.test/", "HTTP/1.1", "HTTP/1.0", "HTTP/2", "Content-Length", "Transfer-Encoding", "chunked",
     "0", "5", "\t", "[::1]", "@", "%", "/", "*", "\x85", "é"]
)  # fmt: skip
HEADISH = st.lists(PIECES, max_size=40).map("".join)


def _head(text: str) -> bytes:
    return (text + "\r\n\r\n").encode("latin-1", errors="replace")


@given(HEADISH)
@example("GET / HTTP/1.1\r\nX-Pad: 1\nHost: evil.test")  # a bare LF: a Host this parser would not see
@example("GET / HTTP/1.1\r\nHost: good.test\r\nX: \0")
@settings(max_examples=400, deadline=None)
def test_the_head_parser_accepts_only_unambiguous_heads(text: str) -> None:
    try:
        request = _Request.parse(_head(text))
    except (ValueError, _Refused):
        return
    for part in (request.method, request.target, *(f"{k}{v}" for k, v in request.headers)):
        assert not any(c in part for c in "\r\n\0"), request  # a lenient server would see another line
    assert _Request.parse(request.serialized()) == request  # what is passed on is what was judged
    with contextlib.suppress(ValueError, _Refused):
        host, port, path = request.destination()
        assert _Request.parse(request.forwarded(path)).values("host")


@given(st.binary(max_size=600))
@settings(max_examples=300, deadline=None)
def test_the_client_hello_reader_raises_only_its_own_errors(data: bytes) -> None:
    with contextlib.suppress(NotClientHello, IncompleteHello, ValueError):
        client_hello_sni(b"\x16\x03" + data)


class _Errors(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


async def _send_to_proxy(data: bytes) -> tuple[bytes, list[str], int]:
    """``data`` to a proxy allowing nothing; its answer, what it logged at WARNING and up, its connects."""
    errors = _Errors()
    logger = logging.getLogger("sandbox.network")
    logger.addHandler(errors)
    connects: list[object] = []
    proxy = EgressProxy(
        EgressPolicy.from_patterns([]), tcp=("127.0.0.1", 0), resolver=StaticResolver({}), on_connect=connects.append
    )
    try:
        async with proxy:
            address = proxy.tcp_address
            assert address is not None
            answer = await _exchange(address, data)
            second = await _exchange(address, b"CONNECT evil.test:443 HTTP/1.1\r\n\r\n")  # still serving
            assert second.startswith(b"HTTP/1.1 403"), second
    finally:
        logger.removeHandler(errors)
    return answer, [record.getMessage() for record in errors.records], len(connects)


async def _exchange(address: tuple[str, int], data: bytes) -> bytes:
    answer = bytearray()
    async with await anyio.connect_tcp(*address) as stream:
        with contextlib.suppress(anyio.BrokenResourceError):
            await stream.send(data)
            await stream.send_eof()
        with anyio.fail_after(5), contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError):
            while len(answer) < 1 << 16:
                answer += await stream.receive()
    assert len(answer) < 1 << 16, "the proxy answered garbage at length"
    return bytes(answer)


SOCKSISH = st.tuples(st.binary(max_size=4), st.binary(max_size=40)).map(lambda p: b"\x05" + p[0] + b"\x05" + p[1])
CLIENT_BYTES = st.one_of(st.binary(max_size=512), HEADISH.map(_head), SOCKSISH)


@given(CLIENT_BYTES)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
async def test_the_proxy_refuses_garbage_and_keeps_serving(data: bytes) -> None:
    answer, logged, connects = await _send_to_proxy(data)
    assert logged == []
    assert connects == 0
    refusal = answer.startswith((b"HTTP/1.1 4", b"HTTP/1.1 5")) or answer[:1] == b"\x05"
    assert answer == b"" or refusal, answer[:200]
