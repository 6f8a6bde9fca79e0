"""`sandbox mcp` over stdio, driven by the official SDK's own client, with the bubblewrap backend.

The server is the real command (`sandbox mcp --workspace ...`) spawned by the SDK's
``stdio_client``; every call goes through the five boundaries into a bwrap jail. Covered: the
tool listing and its schemas, each tool's round trip, Bash's streams apart in structuredContent
and live as progress notifications, cancellation killing the process tree (and the audit saying
ABORTED), approvals through elicitation (allow once, allow for the session, decline, dismiss, no
capability), errors as ``isError`` results, review snapshots and rollback.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from importlib.resources import files
from typing import TYPE_CHECKING, Any, cast

import anyio
import mcp_types as types
import pytest
from mcp import Client, ClientSession, StdioServerParameters, stdio_client
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from sandbox import changes as changes_store
from sandbox.audit import AuditLog
from tests.conftest import BACKENDS, backend_or_skip, own_like_a_checkout, survivors
from tests.mcp_support import Answer, Asker, audited_errors, data, leave_mid_call, text, until
from tests.rpc_client import SANDBOX

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from mcp.client import ClientRequestContext

pytestmark = [pytest.mark.anyio, pytest.mark.bwrap]


@contextlib.asynccontextmanager
async def connect(
    workspace: Path,
    *args: str,
    elicit: Asker | None = None,
    mode: str = "auto",
    backend: str = "bwrap",
    logged: list[types.LoggingMessageNotificationParams] | None = None,
) -> AsyncIterator[ClientSession]:
    backend_or_skip(backend)
    argv = ["mcp", "--workspace", str(workspace), "--backend", backend, "--mode", mode, *args]
    server = StdioServerParameters(command=SANDBOX, args=argv, env=dict(os.environ))

    async def log(params: types.LoggingMessageNotificationParams) -> None:
        if logged is not None:
            logged.append(params)

    async with (
        stdio_client(server) as (read, write),
        ClientSession(read, write, elicitation_callback=elicit, logging_callback=log) as s,
    ):
        await s.initialize()
        yield s


async def test_lists_the_tools_with_their_parameter_schemas(workspace: Path) -> None:
    async with connect(workspace) as s:
        listed = {tool.name: tool for tool in (await s.list_tools()).tools}
    assert {"Bash", "Read", "Write", "Edit", "Glob", "Grep", "LS"} <= set(listed)
    assert {"SandboxSnapshots", "SandboxRollback", "SandboxChanges"} <= set(listed)
    bash = listed["Bash"]
    assert bash.input_schema["required"] == ["command"] and bash.input_schema["additionalProperties"] is False
    assert "timeout" in bash.input_schema["properties"] and bash.description and "sandbox" in bash.description
    assert listed["Edit"].input_schema["required"] == ["path", "edits"]
    assert "outputMode" in listed["Grep"].input_schema["properties"]
    assert listed["Read"].annotations is not None and listed["Read"].annotations.read_only_hint is True


async def test_each_tool_round_trips_in_the_jail(workspace: Path) -> None:
    async with connect(workspace) as s:
        wrote = await s.call_tool("Write", {"path": "notes/a.txt", "content": "alpha\nbeta\n"})
        edited = await s.call_tool(
            "Edit", {"path": "notes/a.txt", "edits": [{"old_text": "beta", "new_text": "gamma"}]}
        )
        read = await s.call_tool("Read", {"path": "notes/a.txt"})
        globbed = await s.call_tool("Glob", {"pattern": "**/*.txt"})
        grepped = await s.call_tool("Grep", {"pattern": "gam+a"})
        listed = await s.call_tool("LS", {"path": "notes"})
        bash = await s.call_tool("Bash", {"command": "cat notes/a.txt; pwd"})
    for result in (wrote, edited, read, globbed, grepped, listed, bash):
        assert not result.is_error and data(result)["ok"] and data(result)["error_code"] is None, result
        assert data(result)["text"] == text(result), result  # a client reading either part reads the same
    assert "     1\talpha\n     2\tgamma" in data(read)["text"]  # the file itself, lines numbered
    assert (workspace / "notes" / "a.txt").read_text() == "alpha\ngamma\n"
    assert data(wrote)["review"]["status"] == "added" and data(edited)["review"]["status"] == "modified"
    assert "gamma" in text(read) and "notes/a.txt" in text(globbed) and "gamma" in text(grepped)
    assert "a.txt" in text(listed)
    assert data(bash)["stdout"] == f"alpha\ngamma\n{workspace}\n" and data(bash)["exit_code"] == 0


@pytest.mark.parametrize("backend_name", [pytest.param(b, marks=getattr(pytest.mark, b)) for b in BACKENDS])
async def test_streams_apart_on_each_backend(backend_name: str, workspace: Path, marker: str) -> None:
    if backend_name == "docker":
        own_like_a_checkout(workspace)
    async with connect(workspace, backend=backend_name) as s:
        bash = await s.call_tool("Bash", {"command": "echo out; echo err >&2; exit 2"})
        read = await s.call_tool("Read", {"path": "src/app.py"})
        with anyio.fail_after(60):
            timed_out = await s.call_tool("Bash", {"command": f"sleep {marker}", "timeout": 1})
    assert (data(bash)["stdout"], data(bash)["stderr"], data(bash)["exit_code"]) == ("out\n", "err\n", 2)
    assert data(bash)["details"]["backend"] == backend_name and "hello" in text(read)
    assert timed_out.is_error and data(timed_out)["error_code"] == "TIMEOUT" and survivors(marker) == []


async def test_bash_streams_apart_and_live_as_progress(workspace: Path) -> None:
    seen: list[tuple[float, str]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        assert total is None and progress > 0
        seen.append((time.monotonic(), message or ""))

    command = "echo first; echo oops >&2; sleep 1.5; echo second; exit 3"
    async with connect(workspace) as s:
        result = await s.call_tool("Bash", {"command": command}, progress_callback=on_progress)
        ended = time.monotonic()
    body = data(result)
    assert result.is_error and body["error_code"] == "TOOL_FAILED" and body["exit_code"] == 3
    assert (body["stdout"], body["stderr"]) == ("first\nsecond\n", "oops\n")
    assert (body["stdout_bytes"], body["stderr_bytes"]) == (13, 5)
    assert body["stdout_truncated"] is False and body["details"]["backend"] == "bwrap"
    assert "[stdout] first\n" in [m for _, m in seen] and "[stderr] oops\n" in [m for _, m in seen]
    first = next(at for at, m in seen if m == "[stdout] first\n")
    assert ended - first > 1.0  # it arrived while the command still ran, not with the result


async def test_cancellation_kills_the_tree_and_is_audited(workspace: Path, marker: str) -> None:
    async with connect(workspace) as s:
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:

                async def call() -> None:
                    await s.call_tool("Bash", {"command": f"setsid sleep {marker} & sleep {marker}"})

                tg.start_soon(call)
                await until(lambda: survivors(marker))
                tg.cancel_scope.cancel()  # the SDK sends notifications/cancelled for the call
            await until(lambda: not survivors(marker))
        after = await s.call_tool("Bash", {"command": "echo still serving"})
    assert survivors(marker) == [] and data(after)["stdout"] == "still serving\n"
    assert audited_errors(marker, tool="Bash") == ["ABORTED"]


async def test_disconnect_mid_call_kills_the_tree(workspace: Path, marker: str) -> None:
    await leave_mid_call(connect(workspace), marker)
    assert audited_errors(marker) == ["ABORTED"]


OUTSIDE = "/etc/hostname"  # outside the workspace: the policy asks before a read there


async def test_elicitation_allow_once_then_asks_again(workspace: Path) -> None:
    asker = Asker("allow-once", "allow-once")
    async with connect(workspace, elicit=asker, mode="ask") as s:
        first = await s.call_tool("Read", {"path": OUTSIDE})
        second = await s.call_tool("Read", {"path": OUTSIDE})
    assert not first.is_error and not second.is_error and len(asker.asked) == 2
    question = asker.asked[0]
    assert isinstance(question, types.ElicitRequestFormParams) and OUTSIDE in question.message
    offered = [c["const"] for c in question.requested_schema["properties"]["decision"]["oneOf"]]
    assert offered == ["allow-once", "allow-session", "deny"]


async def test_elicitation_allow_for_the_session_asks_once(workspace: Path) -> None:
    asker = Asker("allow-session")
    async with connect(workspace, elicit=asker, mode="ask") as s:
        first = await s.call_tool("Read", {"path": OUTSIDE})
        second = await s.call_tool("Read", {"path": OUTSIDE})
    assert not first.is_error and not second.is_error and len(asker.asked) == 1


HUMAN_S = 0.6  # a person reading the card before answering


@pytest.mark.parametrize(
    ("answer", "reading_s", "reason", "decided_by"),
    [
        (types.ElicitResult(action="decline"), HUMAN_S, "the user denied permission", "user"),
        (types.ElicitResult(action="cancel"), HUMAN_S, "the user dismissed the approval request", "disconnected"),
        ("maybe", 0.0, "not one of the offered choices", "disconnected"),
        # codex exec declines every question, Claude Code's -p dismisses it: the client's refusal, unread
        (types.ElicitResult(action="decline"), 0.0, "the MCP client declined the question itself", "client"),
        (types.ElicitResult(action="cancel"), 0.0, "the MCP client dismissed the question itself", "client"),
    ],
)
async def test_elicitation_refused_denies_with_a_reason(
    workspace: Path, marker: str, answer: Answer, reading_s: float, reason: str, decided_by: str
) -> None:
    async with connect(workspace, elicit=Asker(answer, reading_s=reading_s), mode="ask") as s:
        result = await s.call_tool("Bash", {"command": f"touch made.txt # {marker}"})
    assert result.is_error and data(result)["error_code"] == "TOOL_DENIED" and reason in text(result)
    assert not (workspace / "made.txt").exists()
    (row,) = [r for r in AuditLog().rows() if marker in r["args_preview"]]
    assert row["decided_by"] == decided_by and row["error_code"] == "TOOL_DENIED"


async def test_no_elicitation_capability_denies(workspace: Path) -> None:
    async with connect(workspace, mode="ask") as s:
        result = await s.call_tool("Bash", {"command": "touch made.txt"})
    assert result.is_error and data(result)["error_code"] == "TOOL_DENIED"
    assert "did not declare the elicitation capability" in text(result)
    assert not (workspace / "made.txt").exists()


async def test_errors_are_tool_results_never_protocol_errors(workspace: Path) -> None:
    async with connect(workspace) as s:
        unknown = await s.call_tool("Explode", {})
        invalid = await s.call_tool("Read", {"pathx": "a"})
        too_long = await s.call_tool("Bash", {"command": "true", "timeout": 10**9})
        alive = await s.call_tool("LS", {})
    assert unknown.is_error and data(unknown)["error_code"] == "TOOL_DENIED" and "Explode" in text(unknown)
    assert all(data(r)["text"] == text(r) for r in (unknown, invalid, too_long, alive))
    assert invalid.is_error and data(invalid)["error_code"] == "INVALID_ARGUMENT"
    assert {p["field"] for p in data(invalid)["details"]["problems"]} == {"path", "pathx"}
    assert too_long.is_error and data(too_long)["error_code"] == "INVALID_ARGUMENT"
    assert not alive.is_error


async def test_a_path_outside_the_workspace_through_every_file_tool(workspace: Path) -> None:
    outside: dict[str, dict[str, Any]] = {
        "Read": {"path": "/etc/hostname"},
        "Write": {"path": "/etc/evil", "content": "x"},
        "Edit": {"path": "/etc/hostname", "edits": [{"old_text": "a", "new_text": "b"}]},
        "Glob": {"pattern": "*", "path": "/etc"},
        "Grep": {"pattern": "root", "path": "/etc/passwd"},
        "LS": {"path": "/etc"},
    }
    async with connect(workspace, mode="ask") as s:  # no one to ask: every outside path is refused
        refused = {name: await s.call_tool(name, args) for name, args in outside.items()}
    for name, result in refused.items():
        assert result.is_error and data(result)["error_code"] == "TOOL_DENIED", (name, result)
        assert data(result)["text"] == text(result) and "[TOOL_DENIED] " in text(result), (name, result)
        assert len(text(result)) > len("[TOOL_DENIED] ") + 20, (name, result)  # a readable reason
    assert not os.path.exists("/etc/evil")


async def test_audit_records_every_call(workspace: Path) -> None:
    async with connect(workspace) as s:
        ok = await s.call_tool("Bash", {"command": "echo audited"})
        bad = await s.call_tool("Nope", {})
        turned = await s.call_tool("LS", {}, meta=cast("types.RequestParamsMeta", {"sandbox/turnId": "t-7"}))
    rows = AuditLog().rows()
    ids = {r["tool_call_id"]: r for r in rows}
    assert ids[data(ok)["tool_call_id"]]["ok"] and ids[data(ok)["tool_call_id"]]["tool"] == "Bash"
    assert (
        ids[data(ok)["tool_call_id"]]["turn_id"] == "turn-0" and ids[data(turned)["tool_call_id"]]["turn_id"] == "t-7"
    )
    assert any(r["tool"] == "Nope" and r["error_code"] == "TOOL_DENIED" for r in rows), bad


async def test_snapshots_and_rollback(workspace: Path) -> None:
    async with connect(workspace) as s:
        wrote = await s.call_tool("Write", {"path": "README.md", "content": "changed\n"})
        listed = await s.call_tool("SandboxSnapshots", {})
        resource = await s.read_resource("sandbox://snapshots")
        snapshot = data(wrote)["review"]["snapshot_id"]
        rolled = await s.call_tool("SandboxRollback", {"snapshot_id": snapshot})
        unknown = await s.call_tool("SandboxRollback", {"snapshot_id": "nope"})
        changes = await s.call_tool("SandboxChanges", {})
    assert [snap["snapshot_id"] for snap in data(listed)["details"]["snapshots"]] == [snapshot]
    block = resource.contents[0]
    assert isinstance(block, types.TextResourceContents) and snapshot in block.text
    assert not rolled.is_error and (workspace / "README.md").read_text() == "# sample\n"
    assert unknown.is_error and data(unknown)["error_code"] == "INVALID_ARGUMENT"
    assert changes.is_error and data(changes)["error_code"] == "INVALID_ARGUMENT"  # an rw mount has no copy


async def test_copy_session_changes_stay_private(workspace: Path) -> None:
    async with connect(workspace, "--mount", "copy") as s:
        wrote = await s.call_tool("Write", {"path": "new.txt", "content": "private\n"})
        changes = await s.call_tool("SandboxChanges", {})
    assert not wrote.is_error and data(wrote)["details"]["private_copy"] is True
    assert not (workspace / "new.txt").exists()
    assert [c["path"] for c in data(changes)["details"]["changes"]] == ["new.txt"]
    kept = changes_store.listing(workspace)  # the connection's end kept them for the user's review
    assert len(kept) == 1 and kept[0].summary()["counts"]["added"] == 1


async def test_an_unanswered_elicitation_times_out_and_denies(workspace: Path, tmp_path: Path) -> None:
    profile = tmp_path / "quick-ask.toml"
    shipped = files("sandbox") / "profiles" / "default.toml"
    profile.write_text(shipped.read_text() + "\n[policy]\napproval_timeout_s = 1\n")

    class Silent(Asker):
        async def __call__(
            self, context: ClientRequestContext, params: types.ElicitRequestParams
        ) -> types.ElicitResult:
            self.asked.append(params)
            await anyio.sleep(30)
            return await super().__call__(context, params)

    silent = Silent()
    started = time.monotonic()
    async with connect(workspace, "--profile", str(profile), elicit=silent, mode="ask") as s:
        result = await s.call_tool("Bash", {"command": "touch made.txt"})
    assert result.is_error and data(result)["error_code"] == "TOOL_DENIED" and "timed out" in text(result)
    assert len(silent.asked) == 1 and time.monotonic() - started < 20
    assert not (workspace / "made.txt").exists()


async def test_the_sdks_auto_mode_client_falls_back_to_the_handshake(workspace: Path) -> None:
    backend_or_skip("bwrap")
    argv = ["mcp", "--workspace", str(workspace), "--backend", "bwrap", "--mode", "ask"]
    server = StdioServerParameters(command=SANDBOX, args=argv, env=dict(os.environ))
    asker = Asker("allow-once")
    async with Client(server, elicitation_callback=asker) as client:
        result = await client.call_tool("Bash", {"command": "touch made.txt"})
        assert client.protocol_version not in MODERN_PROTOCOL_VERSIONS
    assert not result.is_error and len(asker.asked) == 1 and (workspace / "made.txt").exists()


async def test_kept_changesets_are_applied_only_with_the_users_consent(workspace: Path) -> None:
    copying: list[types.LoggingMessageNotificationParams] = []
    async with connect(workspace, "--mount", "copy", logged=copying) as s:
        wrote = await s.call_tool("Write", {"path": "new.txt", "content": "private\n"})
        again = await s.call_tool("Write", {"path": "other.txt", "content": "private\n"})
    # The first result says where the writes go and how to find them later; the client hears it too.
    assert "[sandbox: this session writes to a private copy" in text(wrote) and data(wrote)["text"] == text(wrote)
    assert f"sandbox changes list --workspace {workspace}" in text(wrote) and "[sandbox:" not in text(again)
    assert [(m.level, m.data["code"]) for m in copying] == [("notice", "changes.private-copy")]
    waiting: list[types.LoggingMessageNotificationParams] = []
    async with connect(workspace, logged=waiting) as s:  # no elicitation: applying is refused
        resource = await s.read_resource("sandbox://changesets")
        listed = await s.call_tool("SandboxChangesets", {})
        changeset = data(listed)["details"]["changesets"][0]["id"]
        shown = await s.call_tool("SandboxChangesetShow", {"changeset_id": changeset})
        refused = await s.call_tool("SandboxChangesetApply", {"changeset_id": changeset})
    assert "new.txt" in text(shown) and "+private" in text(shown)
    assert f"1 kept changeset(s) of this workspace wait for review: {changeset}" in text(listed)
    assert [(m.level, m.data["code"]) for m in waiting] == [("notice", "changes.waiting")]
    block = resource.contents[0]
    assert isinstance(block, types.TextResourceContents)
    assert [c["id"] for c in json.loads(block.text)["changesets"]] == [changeset]
    assert refused.is_error and data(refused)["error_code"] == "TOOL_DENIED" and not (workspace / "new.txt").exists()
    asker = Asker(types.ElicitResult(action="decline"), "allow-once", "allow-once", reading_s=HUMAN_S)
    async with connect(workspace, elicit=asker) as s:
        declined = await s.call_tool("SandboxChangesetDiscard", {"changeset_id": changeset})
        applied = await s.call_tool("SandboxChangesetApply", {"changeset_id": changeset})
        discarded = await s.call_tool("SandboxChangesetDiscard", {"changeset_id": changeset})
        gone = await s.call_tool("SandboxChangesetShow", {"changeset_id": changeset})
    assert declined.is_error and "denied" in text(declined)
    assert not applied.is_error and (workspace / "new.txt").read_text() == "private\n"
    assert not discarded.is_error and gone.is_error and data(gone)["error_code"] == "INVALID_ARGUMENT"
    question = asker.asked[1]
    assert isinstance(question, types.ElicitRequestFormParams)
    offered = [c["const"] for c in question.requested_schema["properties"]["decision"]["oneOf"]]
    assert offered == ["allow-once", "deny"]  # never "for the session"


async def test_the_network_allowlist_widens_only_with_the_users_consent_and_narrows_unasked(
    workspace: Path, tmp_path: Path
) -> None:
    profile = tmp_path / "allowlist.toml"
    profile.write_text('requires = []\n[network]\nmode = "allowlist"\nallow = ["pypi.org"]\n')
    async with connect(workspace, "--profile", str(profile)) as s:  # no elicitation: widening is refused
        refused = await s.call_tool("SandboxNetwork", {"add": ["example.com"]})
        narrowed = await s.call_tool("SandboxNetwork", {"remove": ["pypi.org"]})
    assert refused.is_error and data(refused)["error_code"] == "TOOL_DENIED", text(refused)
    assert not narrowed.is_error and data(narrowed)["details"]["allow"] == [], text(narrowed)
    asker = Asker(types.ElicitResult(action="decline"), "allow-once", reading_s=HUMAN_S)
    async with connect(workspace, "--profile", str(profile), elicit=asker) as s:
        declined = await s.call_tool("SandboxNetwork", {"add": ["example.com"]})
        added = await s.call_tool("SandboxNetwork", {"add": ["example.com", "pypi.org"]})
        shown = await s.call_tool("SandboxNetwork", {})
        bad = await s.call_tool("SandboxNetwork", {"add": ["not a host"]})
    assert declined.is_error and "denied" in text(declined)
    assert not added.is_error and data(shown)["details"]["allow"] == ["pypi.org", "example.com"], text(shown)
    assert len(asker.asked) == 2 and bad.is_error and data(bad)["error_code"] == "INVALID_ARGUMENT"
