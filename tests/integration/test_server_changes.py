"""`sandbox serve` with a copy mount: the live changeset, kept at close, reviewed and applied over RPC."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from tests.conftest import backend_or_skip
from tests.rpc_client import Client, serve

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

pytestmark = [pytest.mark.anyio, pytest.mark.bwrap]
SANDBOX_ERROR = -32000


@pytest.fixture
async def client() -> AsyncIterator[Client]:
    backend_or_skip("bwrap")
    async with serve() as c:
        yield c


async def open_session(client: Client, workspace: Path, mount: str) -> str:
    reply = await client.call("session.open", {"workspace": str(workspace), "mode": "auto", "mount": mount})
    assert reply["result"]["mount"] == mount, reply
    return str(reply["result"]["session_id"])


async def tool(client: Client, sid: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    reply = await client.call("tool.call", {"session_id": sid, "tool": name, "args": args})
    assert reply["result"]["ok"], reply
    return dict(reply["result"])


def error_code(reply: dict[str, Any]) -> str:
    assert reply["error"]["code"] == SANDBOX_ERROR, reply
    return str(reply["error"]["data"]["code"])


async def test_copy_session_changes_are_kept_at_close_and_applied(client: Client, workspace: Path) -> None:
    sid = await open_session(client, workspace, "copy")
    wrote = await tool(client, sid, "Write", {"path": "notes.txt", "content": "kept\n"})
    assert wrote["content"].startswith("wrote 5 bytes to ") and "private copy" in wrote["content"]
    assert wrote["details"]["private_copy"] is True
    await tool(client, sid, "Bash", {"command": "echo 'export X=1' > .envrc"})
    live = (await client.call("session.changes", {"session_id": sid}))["result"]
    statuses = {c["path"]: (c["status"], c.get("flags", [])) for c in live["changes"]}
    assert statuses["notes.txt"] == ("added", []) and "dotfile" in statuses[".envrc"][1]
    assert live["counts"]["added"] == 2 and live["counts"]["flagged"] == 1

    closed = (await client.call("session.close", {"session_id": sid}))["result"]
    assert closed["closed"] is True and closed["changeset_id"].startswith("ch-")
    assert closed["counts"]["added"] == 2
    assert not (workspace / "notes.txt").exists() and not (workspace / ".envrc").exists()
    cid = closed["changeset_id"]

    listed = (await client.call("changes.list", {"workspace": str(workspace)}))["result"]
    assert [k["id"] for k in listed["changesets"]] == [cid] and listed["changesets"][0]["source"] == "session"
    shown = (await client.call("changes.show", {"changeset_id": cid, "paths": ["notes.txt"]}))["result"]
    assert "+kept" in shown["diff"] and ".envrc" not in shown["diff"]

    applied = (await client.call("changes.apply", {"changeset_id": cid}))["result"]
    assert applied["applied"] == ["notes.txt"] and [h["path"] for h in applied["held_back"]] == [".envrc"]
    assert (workspace / "notes.txt").read_text() == "kept\n" and not (workspace / ".envrc").exists()
    flagged = (await client.call("changes.apply", {"changeset_id": cid, "include_flagged": True}))["result"]
    assert flagged["applied"] == [".envrc"] and flagged["state"] == "applied"
    assert (workspace / ".envrc").read_text() == "export X=1\n"

    assert (await client.call("changes.discard", {"changeset_id": cid}))["result"] == {}
    assert error_code(await client.call("changes.show", {"changeset_id": cid})) == "INVALID_ARGUMENT"


async def test_unchanged_copy_session_keeps_nothing(client: Client, workspace: Path) -> None:
    sid = await open_session(client, workspace, "copy")
    closed = (await client.call("session.close", {"session_id": sid}))["result"]
    assert closed == {"closed": True, "changeset_id": None, "counts": None}


async def test_refusals_carry_stable_codes(client: Client, workspace: Path) -> None:
    sid = await open_session(client, workspace, "rw")
    rw = await client.call("session.changes", {"session_id": sid})
    assert error_code(rw) == "INVALID_ARGUMENT" and "writes in place" in rw["error"]["message"]
    wrote = await tool(client, sid, "Write", {"path": "notes.txt", "content": "in place\n"})
    assert "private copy" not in wrote["content"] and "private_copy" not in wrote["details"]
    assert (await client.call("session.close", {"session_id": sid}))["result"] == {"closed": True}
    for name in ("changes.show", "changes.apply", "changes.discard"):
        assert error_code(await client.call(name, {"changeset_id": "ch-000000000000"})) == "INVALID_ARGUMENT"
    extra = await client.call("changes.apply", {"changeset_id": "ch-000000000000", "force": True})
    assert extra["error"]["code"] == -32602
