"""`sandbox serve` over real pipes: streaming, approvals that fail closed, cancel, errors."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import pytest

from sandbox.audit import AuditLog
from sandbox.profile_tables import MAX_TIMEOUT_S
from tests.conftest import backend_or_skip, survivors
from tests.rpc_client import SANDBOX, Client, serve

if TYPE_CHECKING:
    from collections.abc import AsyncIterator


pytestmark = [pytest.mark.anyio, pytest.mark.bwrap]


@pytest.fixture
async def client(workspace: Path) -> AsyncIterator[Client]:  # noqa: ARG001 - the server opens it by path
    backend_or_skip("bwrap")
    async with serve() as c:
        yield c


async def open_session(client: Client, workspace: Path, mode: str = "auto") -> str:
    reply = await client.call("session.open", {"workspace": str(workspace), "mode": mode})
    assert reply["result"]["backend"] == "bwrap"
    return str(reply["result"]["session_id"])


async def test_initialize_and_bash_streams_tagged_chunks(client: Client, workspace: Path) -> None:
    init = await client.call("initialize", {"client": "test"})
    assert init["result"]["protocol"] == 1 and "Bash" in init["result"]["tools"]
    sid = await open_session(client, workspace)
    reply = await client.call(
        "tool.call",
        {"session_id": sid, "tool": "Bash", "tool_call_id": "c1", "args": {"command": "echo out; echo err >&2"}},
    )
    assert reply["result"]["ok"] is True
    streams = {(n["stream"], n["data"]) for n in client.notes if n["tool_call_id"] == "c1"}
    assert streams == {("stdout", "out\n"), ("stderr", "err\n")}


async def test_approval_deny_allow_session_and_closed_pipe(client: Client, workspace: Path) -> None:
    sid = await open_session(client, workspace, mode="ask")
    denied = await client.call(
        "tool.call", {"session_id": sid, "tool": "Write", "args": {"path": "a.txt", "content": "x"}}
    )
    assert denied["result"]["error_code"] == "TOOL_DENIED" and not (workspace / "a.txt").exists()
    assert client.approvals[-1]["resource"] == str(workspace / "a.txt")
    client.answer = {"decision": "allow-session"}
    first = await client.call(
        "tool.call", {"session_id": sid, "tool": "Write", "turn_id": "t2", "args": {"path": "a.txt", "content": "x"}}
    )
    asked = len(client.approvals)
    second = await client.call(
        "tool.call", {"session_id": sid, "tool": "Write", "turn_id": "t2", "args": {"path": "b.txt", "content": "y"}}
    )
    assert first["result"]["ok"] and second["result"]["ok"] and len(client.approvals) == asked
    # Each asked call's result carries its approval record (who answered what, for which scope); a
    # call that rode a grant was asked nothing and carries none.
    record = denied["result"]["details"]["approval"]
    assert (record["decided_by"], record["answer"], record["allowed"], record["scope"]) == (
        "user",
        "deny",
        False,
        "call",
    )
    assert record["resource"] == str(workspace / "a.txt") and record["rule_id"]
    granted = first["result"]["details"]["approval"]
    assert (granted["answer"], granted["allowed"], granted["scope"]) == ("allow-session", True, "session")
    assert "approval" not in second["result"]["details"]
    client.answer = {"decision": "maybe"}
    bad = await client.call("tool.call", {"session_id": sid, "tool": "Bash", "args": {"command": "touch c.txt"}})
    assert bad["result"]["error_code"] == "TOOL_DENIED" and not (workspace / "c.txt").exists()


async def test_closed_pipe_during_approval_denies_and_server_exits(
    client: Client, workspace: Path, marker: str
) -> None:
    sid = await open_session(client, workspace, mode="ask")
    client.answer = "close"
    reply: dict[str, Any] = {}
    with anyio.fail_after(30), contextlib.suppress(anyio.EndOfStream, anyio.IncompleteRead):
        reply = await client.call(
            "tool.call", {"session_id": sid, "tool": "Bash", "args": {"command": f"touch made.txt; sleep {marker}"}}
        )
    # Either the denial still reached us before the server exited, or nothing did: never a run.
    assert reply == {} or reply["result"]["error_code"] == "TOOL_DENIED"
    with anyio.fail_after(30):
        await client.proc.wait()
    assert survivors(marker) == [] and not (workspace / "made.txt").exists()
    assert client.approvals and "touch made.txt" in client.approvals[0]["resource"]


async def test_cancel_kills_the_running_tree(client: Client, workspace: Path, marker: str) -> None:
    sid = await open_session(client, workspace)

    async def cancel_when_running() -> None:
        while not survivors(marker):
            await anyio.sleep(0.05)
        await client.send({"jsonrpc": "2.0", "method": "$/cancelRequest", "params": {"id": 1 + client.next_id - 1}})

    async with anyio.create_task_group() as tg:
        tg.start_soon(cancel_when_running)
        reply = await client.call(
            "tool.call",
            {"session_id": sid, "tool": "Bash", "args": {"command": f"setsid sleep {marker} & sleep {marker}"}},
        )
    assert reply["result"]["error_code"] == "ABORTED"
    assert survivors(marker) == []


async def test_protocol_errors(client: Client, workspace: Path) -> None:
    unknown = await client.call("tool.explode", {})
    assert unknown["error"]["code"] == -32601
    bad = await client.call("session.open", {"workspace": str(workspace), "mode": "yolo"})
    assert bad["error"]["code"] == -32602 and bad["error"]["data"]["code"] == "INVALID_ARGUMENT"
    missing = await client.call("tool.call", {"session_id": "nope", "tool": "Read", "args": {"path": "x"}})
    assert missing["error"]["code"] == -32602
    ws_gone = await client.call("session.open", {"workspace": "/does/not/exist"})
    assert ws_gone["error"]["data"]["code"] == "INVALID_ARGUMENT"


async def test_rollback_and_audit_query(client: Client, workspace: Path) -> None:
    sid = await open_session(client, workspace)
    wrote = await client.call(
        "tool.call", {"session_id": sid, "tool": "Write", "args": {"path": "README.md", "content": "new\n"}}
    )
    snapshot = wrote["result"]["review"]["snapshot_id"]
    rolled = await client.call("snapshot.rollback", {"session_id": sid, "snapshot_id": snapshot})
    assert rolled["result"]["ok"] and (workspace / "README.md").read_text() == "# sample\n"
    audit = await client.call("audit.query", {"session_id": sid})
    assert [r["tool"] for r in audit["result"]["records"]] == ["Write"]
    done = await client.call("shutdown", {})
    assert done["result"] == {}
    with anyio.fail_after(10):
        await client.proc.wait()


def test_schema_is_generated_from_the_models() -> None:
    import subprocess

    out = subprocess.run([SANDBOX, "serve", "--schema"], capture_output=True, text=True, check=True)
    schema = json.loads(out.stdout)
    assert {"tool.call", "session.open", "snapshot.rollback"} <= set(schema["requests"])
    # The schema's cap; each session's profile (timeouts.max_s) sets the ceiling a call may use.
    assert schema["tools"]["Bash"]["properties"]["timeout"]["maximum"] == MAX_TIMEOUT_S


def test_committed_schema_is_current() -> None:
    """integrations/protocol.schema.json is what `sandbox serve --schema` prints (run `make schema`)."""
    import subprocess

    out = subprocess.run([SANDBOX, "serve", "--schema"], capture_output=True, text=True, check=True)
    committed = Path(__file__).resolve().parents[2] / "integrations" / "protocol.schema.json"
    assert json.loads(committed.read_text()) == json.loads(out.stdout)


def test_one_registry_serves_and_describes_the_methods() -> None:
    """Every registered method is in the schema, in order, and its choices are the vocabulary's."""
    from typing import get_args

    from sandbox import server
    from sandbox.vocabulary import Answer, BackendChoice, MountStrategy, PermissionMode

    schema = server.schema()
    assert list(schema["requests"]) == list(server.METHODS) and "session.open" in server.METHODS
    opened = schema["requests"]["session.open"]["properties"]
    for key, words in (("backend", BackendChoice), ("mount", MountStrategy), ("mode", PermissionMode)):
        assert opened[key]["anyOf"][0]["enum"] == list(get_args(words)), key
    answer = schema["server_requests"]["approval.request"]["result"]["properties"]["decision"]
    assert answer["enum"] == list(get_args(Answer))


async def test_refusals_say_who_refused(client: Client, workspace: Path) -> None:
    """A user's no, a client with no one to ask, and an unanswerable reply read differently, in the
    result and in the audit (``decided_by``, ``prompted``) that ``sandbox audit stats`` counts."""
    sid = await open_session(client, workspace, mode="ask")
    outcomes = {}
    for call_id, answer in (
        ("by-user", {"decision": "deny"}),
        ("by-nobody", {"decision": "deny", "answered_by": "nobody"}),
        ("garbled", {"decision": "maybe"}),
    ):
        client.answer = answer
        reply = await client.call(
            "tool.call",
            {
                "session_id": sid,
                "tool": "Write",
                "tool_call_id": call_id,
                "turn_id": call_id,
                "args": {"path": f"{call_id}.txt", "content": "x"},
            },
        )
        outcomes[call_id] = reply["result"]
    assert all(r["error_code"] == "TOOL_DENIED" for r in outcomes.values())
    assert "the user denied permission" in outcomes["by-user"]["content"]
    assert "no one could be asked: the call was refused (fail closed)" in outcomes["by-nobody"]["content"]
    assert "user" not in outcomes["by-nobody"]["content"]
    records = (await client.call("audit.query", {"session_id": sid}))["result"]["records"]
    seen = {r["tool_call_id"]: (r["decided_by"], r["prompted"]) for r in records}
    assert seen == {"by-user": ("user", True), "by-nobody": ("unattended", False), "garbled": ("error", False)}
    assert AuditLog().stats()["by_decided_by"] == {"user": 1, "unattended": 1, "error": 1}


async def test_a_flood_streams_the_budget_then_one_notice_and_the_capture_is_whole(
    client: Client, workspace: Path
) -> None:
    sid = await open_session(client, workspace)
    reply = await client.call(
        "tool.call",
        {"session_id": sid, "tool": "Bash", "tool_call_id": "flood", "args": {"command": "head -c 64M /dev/zero"}},
    )
    result = reply["result"]
    streamed = client.output("flood", "stdout")
    assert len(streamed) == 1 << 20  # the profile's live budget, not 64 MiB of JSON
    [notice] = [e["params"] for e in client.events if e["method"] == "tool.output.withheld"]
    assert notice["tool_call_id"] == "flood" and notice["withheld"]["stdout"] > 0
    live = result["details"]["live"]
    assert live["stdout"] == {"streamed": 1 << 20, "withheld": (64 << 20) - (1 << 20)}
    assert result["details"]["stdout_bytes"] == 64 << 20  # the capture counts everything


async def test_small_writes_are_coalesced_into_few_messages(client: Client, workspace: Path) -> None:
    sid = await open_session(client, workspace)
    await client.call(
        "tool.call", {"session_id": sid, "tool": "Bash", "tool_call_id": "lines", "args": {"command": "seq 1 5000"}}
    )
    messages = [n for n in client.notes if n["tool_call_id"] == "lines"]
    assert "".join(n["data"] for n in messages) == "".join(f"{i}\n" for i in range(1, 5001))
    assert len(messages) < 50, len(messages)


async def test_a_client_that_does_not_read_never_holds_the_command_up(client: Client, workspace: Path) -> None:
    sid = await open_session(client, workspace)
    marker = workspace / "finished"
    command = f"head -c 32M /dev/urandom; touch {marker}"
    await client.send(
        {
            "jsonrpc": "2.0",
            "id": "slow",
            "method": "tool.call",
            "params": {"session_id": sid, "tool": "Bash", "tool_call_id": "slow", "args": {"command": command}},
        }
    )
    # Nothing is read from the server meanwhile: its pipe to us fills, the command goes on.
    with anyio.fail_after(60):
        while not marker.exists():
            await anyio.sleep(0.05)
    with anyio.fail_after(60):
        while True:
            message = json.loads(await client.lines.receive_until(b"\n", 1 << 26))
            if message.get("id") == "slow":
                break
    assert message["result"]["details"]["stdout_bytes"] == 32 << 20


async def test_a_rule_saved_while_the_session_runs_applies_at_its_next_call(client: Client, workspace: Path) -> None:
    sid = await open_session(client, workspace)
    call = {"session_id": sid, "tool": "Bash", "args": {"command": "echo before"}}
    assert (await client.call("tool.call", call))["result"]["ok"]
    saved = await anyio.run_process([SANDBOX, "policy", "block", "echo"], check=True)
    assert saved.returncode == 0
    refused = (await client.call("tool.call", call))["result"]
    assert refused["error_code"] == "TOOL_DENIED" and "block rule" in refused["content"], refused


async def test_session_configure_changes_the_modes_between_calls_only(client: Client, workspace: Path) -> None:
    sid = await open_session(client, workspace, mode="ask")
    write = {"session_id": sid, "tool": "Write", "args": {"path": "m.txt", "content": "x"}}
    changed = await client.call("session.configure", {"session_id": sid, "mode": "auto"})
    everything = ["Bash", "Read", "Write", "Edit", "Glob", "Grep", "LS"]
    assert changed["result"] == {
        "session_id": sid,
        "mode": "auto",
        "mode_source": "session",
        "operating_mode": "agent",
        "notices": [],
        "tools": everything,
        "network": {"mode": "none", "allow": [], "deny": []},  # what holds now (issue 36: it may change live)
    }
    assert (await client.call("tool.call", write))["result"]["ok"] and not client.approvals
    planned = await client.call("session.configure", {"session_id": sid, "operating_mode": "plan"})
    assert planned["result"]["operating_mode"] == "plan"
    # Plan lists no Write or Edit, and says that under auto Bash may still write unasked.
    assert planned["result"]["tools"] == ["Bash", "Read", "Glob", "Grep", "LS"]
    assert [n["code"] for n in planned["result"]["notices"]] == ["mode.bash-may-write"]
    listed = (await client.call("tools.list", {"session_id": sid}))["result"]["tools"]
    assert [tool["name"] for tool in listed] == planned["result"]["tools"]
    refused = (await client.call("tool.call", write))["result"]
    assert refused["error_code"] == "TOOL_DENIED" and "plan mode" in refused["content"]
    # With a call in flight the transition is refused (the active-turn boundary) and nothing changes.
    busy_call = {
        "session_id": sid,
        "tool": "Bash",
        "tool_call_id": "busy",
        "args": {"command": "echo started; sleep 3"},
    }
    await client.send({"jsonrpc": "2.0", "id": "busy", "method": "tool.call", "params": busy_call})
    with anyio.fail_after(30):
        while json.loads(await client.lines.receive_until(b"\n", 1 << 26)).get("method") != "tool.output":
            pass  # the call is running once its output arrives
    busy = await client.call("session.configure", {"session_id": sid, "operating_mode": "agent"})
    assert busy["error"]["data"]["code"] == "CONFLICT", busy
    with anyio.fail_after(30):
        while json.loads(await client.lines.receive_until(b"\n", 1 << 26)).get("id") != "busy":
            pass
    after = await client.call("session.configure", {"session_id": sid})
    assert after["result"]["operating_mode"] == "plan"
    # "inherit" drops the session's own mode: the profile's or the user's global one applies again.
    inherited = (await client.call("session.configure", {"session_id": sid, "mode": "inherit"}))["result"]
    assert (inherited["mode"], inherited["mode_source"]) == ("ask", "default")
