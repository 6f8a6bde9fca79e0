"""`sandbox mcp --http` and `--unix`: streamable HTTP behind a bearer token, with the SDK's own client.

The server is the real command on a loopback port (port 0: the announced address is the bound
one) or a unix socket; the client is the SDK's ``streamable_http_client`` over an ``httpx2``
client carrying the token. Without the token, or with another, every request is refused 401; a
non-loopback bind is refused unless ``--allow-remote``.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from typing import TYPE_CHECKING, Any

import anyio
import httpx2
import pytest
from anyio.streams.text import TextReceiveStream
from mcp import Client, ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from sandbox.cli.output import EXIT_ERROR
from tests.conftest import backend_or_skip
from tests.mcp_support import Asker, audited_errors, data, leave_mid_call
from tests.rpc_client import SANDBOX

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from anyio.abc import Process

pytestmark = [pytest.mark.anyio, pytest.mark.bwrap]

TOKEN = "test-token-0123456789"
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}},
}
ANNOUNCED = re.compile(r"streamable HTTP on (\S+?)(?:; bearer token (\S+)| \(bearer token from [^)]*\))\n")


@contextlib.asynccontextmanager
async def http_server(workspace: Path, *where: str, token: str | None = TOKEN) -> AsyncIterator[tuple[str, str]]:
    """The server's URL and token, once it announced them on stderr; killed at the end if still up."""
    backend_or_skip("bwrap")
    env = dict(os.environ)
    env.pop("SANDBOX_MCP_TOKEN", None)
    if token is not None:
        env["SANDBOX_MCP_TOKEN"] = token
    where = where or ("--http", "127.0.0.1:0")
    argv = [SANDBOX, "mcp", "--workspace", str(workspace), "--backend", "bwrap", "--mode", "ask", *where]
    proc = await anyio.open_process(argv, env=env)
    try:
        url, announced = await _announced(proc)
        yield url, announced or token or ""
    finally:
        with anyio.CancelScope(shield=True):
            if proc.returncode is None:
                proc.terminate()
                with anyio.move_on_after(20):
                    await proc.wait()
            if proc.returncode is None:
                proc.kill()
            await proc.wait()
            await proc.aclose()


async def _announced(proc: Process) -> tuple[str, str | None]:
    assert proc.stderr is not None
    seen = ""
    with anyio.fail_after(30):
        async for chunk in TextReceiveStream(proc.stderr):
            seen += chunk
            found = ANNOUNCED.search(seen)
            if found:
                return found.group(1), found.group(2)
    raise AssertionError(f"the server never announced its address: {seen!r}")


@contextlib.asynccontextmanager
async def connect(url: str, token: str, elicit: Asker | None = None) -> AsyncIterator[ClientSession]:
    transport: Any = None
    if url.startswith("unix:"):
        path, url = url.removeprefix("unix:").rsplit("/mcp", 1)[0], "http://localhost/mcp"
        transport = httpx2.AsyncHTTPTransport(uds=path)
    headers = {"Authorization": f"Bearer {token}"}
    async with (
        httpx2.AsyncClient(headers=headers, transport=transport, timeout=httpx2.Timeout(30, read=300)) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write, elicitation_callback=elicit) as s,
    ):
        await s.initialize()
        yield s


async def test_tools_approvals_and_progress_over_http(workspace: Path) -> None:
    seen: list[str] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        assert total is None and progress > 0
        seen.append(message or "")

    asker = Asker("allow-once")
    async with http_server(workspace) as (url, token):
        assert url.startswith("http://127.0.0.1:") and not url.endswith(":0/mcp")
        async with connect(url, token, asker) as s:
            listed = {tool.name for tool in (await s.list_tools()).tools}
            bash = await s.call_tool(
                "Bash", {"command": "touch made; echo out; echo err >&2"}, progress_callback=on_progress
            )
    assert {"Bash", "Read", "Write", "Edit", "Glob", "Grep", "LS"} <= listed
    assert not bash.is_error and (data(bash)["stdout"], data(bash)["stderr"]) == ("out\n", "err\n")
    assert (workspace / "made").exists()
    assert len(asker.asked) == 1 and "[stdout] out\n" in seen and "[stderr] err\n" in seen


async def test_without_the_token_every_request_is_refused(workspace: Path) -> None:
    accept = {"Accept": "application/json, text/event-stream"}
    async with http_server(workspace, "--http", "127.0.0.1:0") as (url, token), httpx2.AsyncClient() as http:
        missing = await http.post(url, json=INITIALIZE, headers=accept)
        wrong = await http.post(url, json=INITIALIZE, headers={**accept, "Authorization": "Bearer nope"})
        right = await http.post(url, json=INITIALIZE, headers={**accept, "Authorization": f"Bearer {token}"})
    assert (missing.status_code, wrong.status_code) == (401, 401)
    assert missing.headers["www-authenticate"].startswith("Bearer")
    assert right.status_code == 200


async def test_a_generated_token_is_printed_once(workspace: Path) -> None:
    async with http_server(workspace, "--http", "127.0.0.1:0", token=None) as (url, token):
        assert len(token) >= 32
        async with connect(url, token) as s:
            result = await s.call_tool("LS", {})
    assert not result.is_error


async def test_unix_socket_is_owner_only(workspace: Path, tmp_path: Path) -> None:
    # Raw requests: the SDK client's SSE streams over anyio's unix sockets trip an asyncio
    # InvalidStateError in the client process (not the server); TCP covers the SDK client.
    path = tmp_path / "mcp.sock"
    transport = httpx2.AsyncHTTPTransport(uds=str(path))
    headers = {"Accept": "application/json, text/event-stream"}
    async with (
        http_server(workspace, "--unix", str(path)) as (url, token),
        httpx2.AsyncClient(transport=transport) as http,
    ):
        assert url == f"unix:{path}/mcp" and stat.S_IMODE(path.stat().st_mode) == 0o600
        refused = await http.post("http://localhost/mcp", json=INITIALIZE, headers=headers)
        answered = await http.post(
            "http://localhost/mcp", json=INITIALIZE, headers={**headers, "Authorization": f"Bearer {token}"}
        )
    assert refused.status_code == 401 and answered.status_code == 200 and '"sandbox"' in answered.text
    assert not path.exists()  # removed when the server stops


async def test_a_remote_bind_is_refused_unless_asked(workspace: Path) -> None:
    backend_or_skip("bwrap")
    argv = [SANDBOX, "mcp", "--workspace", str(workspace), "--http", "0.0.0.0:0"]
    result = await anyio.run_process(argv, check=False)
    assert result.returncode == EXIT_ERROR and b"--allow-remote" in result.stderr


async def test_session_closes_with_the_http_session_and_kills_the_tree(workspace: Path, marker: str) -> None:
    asker = Asker("allow-once")
    async with http_server(workspace) as (url, token):
        await leave_mid_call(connect(url, token, asker), marker)
    assert audited_errors(marker) == ["ABORTED"]


async def test_the_sdks_auto_mode_client_gets_the_handshake_over_http(workspace: Path) -> None:
    async with (
        http_server(workspace) as (url, token),
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(30, read=300)) as http,
        Client(streamable_http_client(url, http_client=http), elicitation_callback=Asker("allow-once")) as client,
    ):
        assert client.protocol_version not in MODERN_PROTOCOL_VERSIONS
        result = await client.call_tool("Bash", {"command": "touch made; echo ok"})
    assert not result.is_error and data(result)["stdout"] == "ok\n" and (workspace / "made").exists()
