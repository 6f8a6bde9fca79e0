"""Session snapshots over MCP (issue 39): ``Snapshot``, ``Restore`` and ``Fork``, driven by the SDK's client.

The real ``sandbox mcp`` over stdio, bubblewrap, ``--mount overlay`` (root: bubblewrap before 0.9
mounts an overlay for root only). A snapshot keeps the session's private view; a Bash call changes
it; a restore brings it back, the host workspace untouched throughout. In ``ask`` a restore is put
to the user once, through elicitation, and refused when the user declines or no one can be asked;
CONFLICT when the host changed a path of the snapshot since. ``Fork`` keeps the branch point and
gives the command of a server per other branch: that very command is started here, and opens from
the branch point in the same line of sessions.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from typing import TYPE_CHECKING

import mcp_types as types
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client

from sandbox.audit import AuditLog
from sandbox.cli import build_parser
from sandbox.cli.output import EXIT_ERROR
from tests.conftest import backend_or_skip
from tests.mcp_support import Asker, data, text
from tests.rpc_client import SANDBOX

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Sequence
    from contextlib import AbstractAsyncContextManager
    from pathlib import Path

pytestmark = [pytest.mark.anyio, pytest.mark.bwrap, pytest.mark.root]

HUMAN_S = 0.6  # a person reading the card before answering (a faster refusal is the client's own)


@pytest.fixture(autouse=True)
def overlay_here() -> None:
    from sandbox.mounts import overlay_support

    backend_or_skip("bwrap")
    if reason := overlay_support():
        pytest.skip(f"no overlay here: {reason}")


@contextlib.asynccontextmanager
async def serve(argv: Sequence[str], elicit: Asker | None = None) -> AsyncIterator[ClientSession]:
    """``sandbox <argv>`` as an MCP server over stdio, its client connected."""
    server = StdioServerParameters(command=SANDBOX, args=list(argv), env=dict(os.environ))
    async with stdio_client(server) as (read, write), ClientSession(read, write, elicitation_callback=elicit) as s:
        await s.initialize()
        yield s


def connect(
    workspace: Path, *args: str, mode: str = "auto", elicit: Asker | None = None
) -> AbstractAsyncContextManager[ClientSession]:
    argv = ["mcp", "--workspace", str(workspace), "--backend", "bwrap", "--mount", "overlay", "--mode", mode]
    return serve([*argv, *args], elicit)


def snapshot_id(result: types.CallToolResult) -> str:
    assert not result.is_error, text(result)
    found = data(result)["details"]["snapshot_id"]
    assert isinstance(found, str) and found.startswith("snap-")
    return found


async def cat(s: ClientSession, path: str) -> str:
    done = await s.call_tool("Bash", {"command": f"cat {path} 2>/dev/null || echo '<missing>'"})
    assert not done.is_error, text(done)
    stdout = data(done)["stdout"]
    assert isinstance(stdout, str)
    return stdout


async def test_the_three_tools_are_listed_with_their_schemas(workspace: Path) -> None:
    async with connect(workspace) as s:
        listed = {tool.name: tool for tool in (await s.list_tools()).tools}
    assert {"Snapshot", "Restore", "Fork"} <= set(listed)
    assert listed["Snapshot"].input_schema.get("properties", {}) == {}
    assert listed["Restore"].input_schema["required"] == ["snapshot_id"]
    assert set(listed["Restore"].input_schema["properties"]) == {"snapshot_id", "force"}
    n = listed["Fork"].input_schema["properties"]["n"]
    assert (n["minimum"], n["maximum"], n["default"]) == (1, 16, 1)
    restore = listed["Restore"].annotations
    assert restore is not None and restore.destructive_hint is True and restore.read_only_hint is False


async def test_snapshot_change_with_bash_restore_and_the_file_is_back(workspace: Path) -> None:
    async with connect(workspace) as s:
        wrote = await s.call_tool("Write", {"path": "notes.txt", "content": "one\n"})
        taken = await s.call_tool("Snapshot", {})
        changed = await s.call_tool("Bash", {"command": "echo two > notes.txt; rm README.md"})
        before = (await cat(s, "notes.txt"), await cat(s, "README.md"))
        restored = await s.call_tool("Restore", {"snapshot_id": snapshot_id(taken)})
        after = (await cat(s, "notes.txt"), await cat(s, "README.md"))
    assert not wrote.is_error and not changed.is_error, (text(wrote), text(changed))
    snap = data(taken)["details"]
    assert snap["id"] == snap["snapshot_id"] and snap["mount"] == "overlay" and snap["changed"] == 1
    assert snap["workspace"] == str(workspace) and snapshot_id(taken) in text(taken)
    assert before == ("two\n", "<missing>\n")
    assert not restored.is_error and data(restored)["ok"] and data(restored)["error_code"] is None, text(restored)
    assert after == ("one\n", "# sample\n") and data(restored)["details"]["snapshot_id"] == snapshot_id(taken)
    assert not (workspace / "notes.txt").exists() and (workspace / "README.md").read_text() == "# sample\n"
    rows = {r["tool_call_id"]: r for r in AuditLog().rows()}
    row = rows[data(restored)["tool_call_id"]]  # the result's call id is the audit row's
    assert row["tool"] == "session.restore" and row["ok"] and row["resource"] == snapshot_id(taken)
    assert any(r["tool"] == "session.snapshot" and r["resource"] == snapshot_id(taken) for r in rows.values())


async def test_restore_is_asked_once_in_ask_mode_and_refused_when_the_user_declines(workspace: Path) -> None:
    # The Write is asked too (ask mode): allowed; the first restore declined, the second allowed.
    asker = Asker("allow-once", types.ElicitResult(action="decline"), "allow-once", reading_s=HUMAN_S)
    async with connect(workspace, mode="ask", elicit=asker) as s:
        taken = await s.call_tool("Snapshot", {})
        wrote = await s.call_tool("Write", {"path": "notes.txt", "content": "changed\n"})
        declined = await s.call_tool("Restore", {"snapshot_id": snapshot_id(taken)})
        kept = await cat(s, "notes.txt")
        allowed = await s.call_tool("Restore", {"snapshot_id": snapshot_id(taken)})
        gone = await cat(s, "notes.txt")
    assert not wrote.is_error, text(wrote)
    assert declined.is_error and data(declined)["error_code"] == "TOOL_DENIED", text(declined)
    assert "the user denied permission" in text(declined) and kept == "changed\n"
    assert not allowed.is_error and gone == "<missing>\n", text(allowed)
    assert len(asker.asked) == 3  # one question a restore: never asked twice
    question = asker.asked[1]
    assert isinstance(question, types.ElicitRequestFormParams) and snapshot_id(taken) in question.message
    offered = [c["const"] for c in question.requested_schema["properties"]["decision"]["oneOf"]]
    assert offered == ["allow-once", "deny"]  # never "for the session"
    (row,) = [r for r in AuditLog().rows() if r["tool_call_id"] == data(declined)["tool_call_id"]]
    assert row["tool"] == "session.restore" and row["error_code"] == "TOOL_DENIED"


async def test_restore_in_ask_mode_without_elicitation_is_refused(workspace: Path) -> None:
    async with connect(workspace, mode="ask") as s:
        taken = await s.call_tool("Snapshot", {})
        refused = await s.call_tool("Restore", {"snapshot_id": snapshot_id(taken)})
    assert refused.is_error and data(refused)["error_code"] == "TOOL_DENIED"
    assert "did not declare the elicitation capability" in text(refused)


async def test_a_host_edit_since_is_a_conflict_unless_forced(workspace: Path) -> None:
    async with connect(workspace) as s:
        await s.call_tool("Write", {"path": "README.md", "content": "the session's\n"})
        taken = await s.call_tool("Snapshot", {})
        (workspace / "README.md").write_text("the host's\n")
        conflict = await s.call_tool("Restore", {"snapshot_id": snapshot_id(taken)})
        forced = await s.call_tool("Restore", {"snapshot_id": snapshot_id(taken), "force": True})
        seen = await cat(s, "README.md")
    assert conflict.is_error and data(conflict)["error_code"] == "CONFLICT", text(conflict)
    assert data(conflict)["details"]["paths"] == ["README.md"] and "README.md" in text(conflict)
    assert not forced.is_error and data(forced)["details"]["host_changed"] == ["README.md"], text(forced)
    assert seen == "the session's\n" and (workspace / "README.md").read_text() == "the host's\n"


async def test_bad_arguments_and_unsnapshottable_sessions_are_invalid(workspace: Path) -> None:
    async with connect(workspace) as s:
        unknown = await s.call_tool("Restore", {"snapshot_id": "snap-0000000000000000"})
        malformed = await s.call_tool("Restore", {"snapshot_id": "nope"})
        extra = await s.call_tool("Snapshot", {"label": "x"})
        too_many = await s.call_tool("Fork", {"n": 17})
    rw = ["mcp", "--workspace", str(workspace), "--backend", "bwrap", "--mount", "rw", "--mode", "auto"]
    async with serve(rw) as s:
        in_place = await s.call_tool("Snapshot", {})
    for result in (unknown, malformed, extra, too_many, in_place):
        assert result.is_error and data(result)["error_code"] == "INVALID_ARGUMENT", text(result)
    assert "no snapshot snap-0000000000000000" in text(unknown) and "n:" in text(too_many)
    assert "'copy' or 'overlay'" in text(in_place)


async def test_fork_keeps_the_branch_point_and_each_branch_is_a_server_started_from_it(workspace: Path) -> None:
    async with connect(workspace) as s:
        await s.call_tool("Write", {"path": "notes.txt", "content": "base\n"})
        forked = await s.call_tool("Fork", {"n": 2})
        await s.call_tool("Write", {"path": "notes.txt", "content": "branch A\n"})
        back = await s.call_tool("Restore", {"snapshot_id": snapshot_id(forked)})
        here = await cat(s, "notes.txt")
    branch_point = snapshot_id(forked)
    details = data(forked)["details"]
    assert details["branches"] == 2 and details["changed"] == 1
    command = details["command"]
    assert command[:2] == ["sandbox", "mcp"] and command[-2:] == ["--from-snapshot", branch_point]
    assert "--mount" in command and command[command.index("--mount") + 1] == "overlay"
    assert details["command_line"] in text(forked) and "Restore" in text(forked)
    assert build_parser().parse_args(command[1:]).from_snapshot == branch_point  # a command `sandbox` takes
    assert not back.is_error and here == "base\n", text(back)
    async with connect(workspace) as s:  # a session of its own line: not this snapshot's to restore
        foreign = await s.call_tool("Restore", {"snapshot_id": branch_point})
    assert foreign.is_error and data(foreign)["error_code"] == "INVALID_ARGUMENT"
    assert f"--from-snapshot {branch_point}" in text(foreign)
    async with serve(command[1:]) as s:  # the other branch, as the user would start it
        seen = await cat(s, "notes.txt")
        await s.call_tool("Write", {"path": "notes.txt", "content": "branch B\n"})
        again = await s.call_tool("Restore", {"snapshot_id": branch_point})  # the same line: allowed
        restored = await cat(s, "notes.txt")
    assert seen == "base\n" and not again.is_error and restored == "base\n", text(again)
    assert not (workspace / "notes.txt").exists()  # every branch's writes are its own, kept for review


def test_a_bad_from_snapshot_is_refused_before_serving(workspace: Path) -> None:
    argv = [SANDBOX, "mcp", "--workspace", str(workspace), "--from-snapshot", "snap-0000000000000000"]
    done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == EXIT_ERROR and done.stdout == ""
    assert "no snapshot snap-0000000000000000" in done.stderr and len(done.stderr.strip().splitlines()) == 1
