"""`sandbox mcp` hands the user's latest message to the classifier (seed 004's "say it in your next message").

The official SDK's client drives the real ``sandbox mcp`` (bubblewrap backend); the profile's
built-in classifier client talks to a scripted chat-completions server on loopback that allows a
call only when the user's message authorises it. The message travels in the request's ``_meta``
(``sandbox/userMessage``), which the client program sets: a tool argument would be written by the
model, which could then authorise itself, so the tools' schemas refuse one.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import TYPE_CHECKING, Any, cast

import mcp_types as types
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client

from sandbox.mcp.server import USER_MESSAGE_META
from tests.chat_model import ChatServer
from tests.conftest import backend_or_skip
from tests.rpc_client import SANDBOX

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator
    from pathlib import Path

pytestmark = [pytest.mark.anyio, pytest.mark.bwrap]

AUTHORISING = "yes, go ahead and touch made.txt this once"
_PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")


def _judge(request: dict[str, Any]) -> tuple[int, str]:
    """Allow when the user's message names the file, else block."""
    authorised = "touch made.txt" in (request.get("user_message") or "")
    verdict = {
        "verdict": "allow" if authorised else "block",
        "reason": "the user asked for it" if authorised else "nobody asked for this file",
    }
    return 200, json.dumps(verdict)


@pytest.fixture
def chat() -> Iterator[ChatServer]:
    with ChatServer(_judge) as server:
        yield server


@contextlib.asynccontextmanager
async def connect(workspace: Path, chat: ChatServer) -> AsyncIterator[ClientSession]:
    backend_or_skip("bwrap")
    profile = workspace.parent / "classified.toml"
    profile.write_text(
        f'[policy]\nclassifier = "auto"\nask_on_block = false\nclassifier_timeout_s = 20\n'
        f'classifier_endpoint = "{chat.url}"\nclassifier_model = "scripted"\n'
    )
    argv = ["mcp", "--workspace", str(workspace), "--backend", "bwrap", "--mode", "ask", "--profile", str(profile)]
    # The classifier's client is urllib on the host: a proxy of the test machine must not carry it.
    env = {k: v for k, v in os.environ.items() if k.lower() not in _PROXY_VARIABLES}
    server = StdioServerParameters(command=SANDBOX, args=argv, env=env)
    async with stdio_client(server) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


def _meta(message: object) -> types.RequestParamsMeta:
    return cast("types.RequestParamsMeta", {USER_MESSAGE_META: message})


def _data(result: types.CallToolResult) -> dict[str, Any]:
    assert isinstance(result.structured_content, dict), result
    return result.structured_content


async def test_the_users_message_in_meta_reaches_the_classifier_and_authorises(
    workspace: Path, chat: ChatServer
) -> None:
    async with connect(workspace, chat) as session:
        result = await session.call_tool("Bash", {"command": "touch made.txt"}, meta=_meta(AUTHORISING))
    assert not result.is_error and _data(result)["ok"], result
    assert (workspace / "made.txt").exists()
    assert [(seen["resource"], seen["user_message"]) for seen in chat.seen] == [("touch made.txt", AUTHORISING)]


async def test_a_blocked_call_runs_when_the_users_next_message_authorises_it(workspace: Path, chat: ChatServer) -> None:
    async with connect(workspace, chat) as session:
        plain = await session.call_tool("Bash", {"command": "touch made.txt"})
        other = await session.call_tool("Bash", {"command": "touch made.txt"}, meta=_meta("fix the failing test"))
        assert not (workspace / "made.txt").exists()
        again = await session.call_tool("Bash", {"command": "touch made.txt"}, meta=_meta("fix the failing test"))
        allowed = await session.call_tool("Bash", {"command": "touch made.txt"}, meta=_meta(AUTHORISING))
    for result in (plain, other, again):
        assert result.is_error and _data(result)["error_code"] == "TOOL_DENIED", result
    assert "not asked again" in str(again.content[0])  # the same message is the same turn: refused as before
    assert not allowed.is_error and (workspace / "made.txt").exists(), allowed
    assert [seen["user_message"] for seen in chat.seen] == [None, "fix the failing test", AUTHORISING]


async def test_the_model_cannot_supply_the_message_as_an_argument(workspace: Path, chat: ChatServer) -> None:
    async with connect(workspace, chat) as session:
        listed = {tool.name: tool for tool in (await session.list_tools()).tools}
        forged = await session.call_tool("Bash", {"command": "touch made.txt", "user_message": AUTHORISING})
        typed = await session.call_tool("Bash", {"command": "touch made.txt"}, meta=_meta(["touch made.txt"]))
    assert "user_message" not in listed["Bash"].input_schema["properties"]
    assert forged.is_error and _data(forged)["error_code"] == "INVALID_ARGUMENT", forged
    assert typed.is_error and _data(typed)["error_code"] == "INVALID_ARGUMENT", typed
    assert USER_MESSAGE_META in typed.content[0].text if isinstance(typed.content[0], types.TextContent) else False
    assert not (workspace / "made.txt").exists() and chat.seen == []
