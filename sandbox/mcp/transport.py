"""How ``sandbox mcp`` is reached: stdio (the default), or streamable HTTP behind a bearer token.

Over stdio the client owns the process: one connection, one session, closed when stdin closes.
While serving, the SDK points fd 0 at the null device and fd 1 at stderr, so nothing a jail
inherits can write onto the wire.

Over HTTP (``--http HOST:PORT`` or ``--unix PATH``) each MCP session (``Mcp-Session-Id``) is one
connection with its own sandbox session, closed when the client deletes it or it goes idle. Every
request must carry ``Authorization: Bearer <token>``, else 401: the token comes from
``--token-file``, else ``$SANDBOX_MCP_TOKEN``, else it is generated and printed once on stderr. A bind
to anything but a loopback address is refused unless ``--allow-remote`` says so; a unix socket
is created owner-only (0600). The socket is bound before the address is announced, so port 0
works and the announced port is the real one.
"""

from __future__ import annotations

import contextlib
import hmac
import ipaddress
import json
import os
import secrets
import socket
import sys
from typing import TYPE_CHECKING, Any

import anyio
import uvicorn
from mcp.server.runner import serve_loop
from mcp.server.stdio import stdio_server
from mcp.server.transport_security import TransportSecuritySettings

from sandbox.ending import end_on_signal
from sandbox.errors import InvalidArgument
from sandbox.mcp.server import Connections, McpOptions, build_server

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterator, MutableMapping
    from pathlib import Path

    Scope = MutableMapping[str, Any]
    Message = MutableMapping[str, Any]
    Receive = Callable[[], Awaitable[Message]]
    Send = Callable[[Message], Awaitable[None]]
    App = Callable[[Scope, Receive, Send], Awaitable[None]]

TOKEN_ENV = "SANDBOX_MCP_TOKEN"
PATH = "/mcp"
_LOOPBACK_NAMES = frozenset({"localhost", "ip6-localhost"})


async def serve_stdio(options: McpOptions) -> None:
    connections = Connections(options)
    server = build_server(options, connections)
    async with anyio.create_task_group() as connections.closing, stdio_server() as (read, write):
        init = server.create_initialization_options()
        async with anyio.create_task_group() as serving:
            # SIGTERM, SIGHUP, SIGINT end the connection as a closed stdin does: its session closes
            # (in connections.closing, which outlives this), a copy session's work is kept.
            serving.start_soon(end_on_signal, serving.cancel_scope.cancel)
            await serve_loop(server, read, write, lifespan_state={}, init_options=init)
            serving.cancel_scope.cancel()


class BearerGuard:
    """An ASGI wrapper: an HTTP request without the token is answered 401 and goes no further."""

    def __init__(self, app: App, token: str) -> None:
        self.app = app
        self.expected = f"Bearer {token}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not self._authorised(scope):
            body = json.dumps({"error": "unauthorized: send Authorization: Bearer <token>"}).encode()
            headers = [
                (b"content-type", b"application/json"),
                (b"www-authenticate", b'Bearer realm="sandbox"'),
                (b"content-length", str(len(body)).encode()),
            ]
            await send({"type": "http.response.start", "status": 401, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)

    def _authorised(self, scope: Scope) -> bool:
        given = next((value for key, value in scope["headers"] if key == b"authorization"), b"")
        return hmac.compare_digest(bytes(given), self.expected)


def resolve_token(token_file: Path | None) -> tuple[str, bool]:
    """The bearer token and whether we generated it (then it is printed once)."""
    if token_file is not None:
        try:
            token = token_file.read_text().strip()
        except OSError as exc:
            raise InvalidArgument(f"--token-file {token_file}: {exc.strerror}", flag="--token-file") from exc
        if not token:
            raise InvalidArgument(f"--token-file {token_file} is empty", flag="--token-file")
        return token, False
    token = os.environ.get(TOKEN_ENV, "").strip()
    if token:
        return token, False
    return secrets.token_urlsafe(32), True


def parse_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise InvalidArgument(f"--http {address}: expected HOST:PORT (e.g. 127.0.0.1:8765)", flag="--http")
    return host.strip("[]") or "127.0.0.1", int(port)


def is_loopback(host: str) -> bool:
    if host in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind_tcp(host: str, port: int, *, allow_remote: bool) -> socket.socket:
    if not is_loopback(host) and not allow_remote:
        raise InvalidArgument(
            f"--http {host}:{port} is not a loopback address: anyone who can reach it and holds the token "
            "could run commands in the workspace; pass --allow-remote to mean it",
            flag="--http",
        )
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _, where = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(where)
    except OSError as exc:
        sock.close()
        raise InvalidArgument(f"--http {host}:{port}: {exc.strerror}", flag="--http") from exc
    return sock


def bind_unix(path: Path) -> socket.socket:
    with contextlib.suppress(FileNotFoundError):
        if path.is_socket():
            path.unlink()  # a stale socket of an earlier run
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)  # owner-only from the start: no window where others may connect
    try:
        sock.bind(str(path))
    except OSError as exc:
        sock.close()
        raise InvalidArgument(f"--unix {path}: {exc.strerror}", flag="--unix") from exc
    finally:
        os.umask(old)
    return sock


def _security(host: str | None) -> TransportSecuritySettings:
    """DNS-rebinding protection on loopback (a browser page cannot name our port); the token is the
    guard on a unix socket and on a remote bind, where the Host header is the client's business."""
    if host is None or not is_loopback(host):
        return TransportSecuritySettings(enable_dns_rebinding_protection=False)
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*"],
        allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"],
    )


async def serve_http(
    options: McpOptions,
    sock: socket.socket,
    token: str,
    *,
    host: str | None,
    announce: Callable[[str], None],
) -> None:
    connections = Connections(options)
    server = build_server(options, connections)
    app = server.streamable_http_app(streamable_http_path=PATH, transport_security=_security(host))
    config = uvicorn.Config(BearerGuard(app, token), log_level="warning", lifespan="on", access_log=False)
    sock.listen(128)
    announce(_url(sock))
    async with anyio.create_task_group() as connections.closing:
        await _Uvicorn(config).serve(sockets=[sock])


class _Uvicorn(uvicorn.Server):
    """uvicorn re-raises a SIGTERM or SIGINT once it has shut down: that would end us with the signal's
    status before the unix socket is removed. A server stopped on request exits 0 instead."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        with super().capture_signals():
            try:
                yield
            finally:
                self._captured_signals.clear()


def _url(sock: socket.socket) -> str:
    if sock.family == socket.AF_UNIX:
        return f"unix:{sock.getsockname()}{PATH}"
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}{PATH}"


def say(line: str) -> None:
    print(f"sandbox mcp: {line}", file=sys.stderr, flush=True)  # noqa: T201 (the CLI's stderr)
