"""Issue 20 items 3, 5 and 6 over the fake backend, through ``sandbox serve`` and the library:
the goal mode and its transitions, plugin tools refused in a contract mode with their own code,
delegates (their tools, their permission never wider than the session, their name on the approval
card and in the audit), and project trust (``default_project_trust``, the ignored-file notice)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from sandbox import profile as profiles
from sandbox.audit import AuditLog
from sandbox.policy.approvals import ApprovalRequest, CallbackApprover
from sandbox.policy.trust import PROJECT_POLICY, TrustStore
from sandbox.session import Sandbox
from sandbox.tools.params import BashParams, ToolSpec
from tests.unit import fake_support

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from tests.unit.fake_support import Client

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("fake")]


@pytest.fixture
async def client() -> AsyncIterator[Client]:
    async with fake_support.serve() as c:
        yield c


async def _open(client: Client, workspace: Path, **params: Any) -> dict[str, Any]:
    reply = await client.call("session.open", {"workspace": str(workspace), "backend": "fake", **params})
    assert "result" in reply, reply
    result: dict[str, Any] = reply["result"]
    return result


async def _records(client: Client, sid: str) -> list[dict[str, Any]]:
    reply = await client.call("audit.query", {"session_id": sid})
    records: list[dict[str, Any]] = reply["result"]["records"]
    return records


# -- the goal mode ----------------------------------------------------------------------------------


async def test_goal_is_entered_from_agent_only(client: Client, workspace: Path) -> None:
    opened = await _open(client, workspace, mode="auto")
    sid = opened["session_id"]
    assert opened["operating_mode"] == "agent"
    goal = await client.call("session.configure", {"session_id": sid, "operating_mode": "goal"})
    assert goal["result"]["operating_mode"] == "goal"
    write = {"session_id": sid, "tool": "Write", "args": {"path": "g.txt", "content": "x"}}
    refused = (await client.call("tool.call", write))["result"]
    assert refused["error_code"] == "TOOL_DENIED" and "goal mode" in refused["content"]
    bash = await client.call("tool.call", {"session_id": sid, "tool": "Bash", "args": {"command": "echo hi"}})
    assert bash["result"]["ok"], bash
    # plan <-> goal goes through agent (seed 003 §10.1: EnterPlanMode and EnterGoalMode exist in agent only).
    direct = await client.call("session.configure", {"session_id": sid, "operating_mode": "plan"})
    assert direct["error"]["data"]["code"] == "INVALID_ARGUMENT" and "agent" in direct["error"]["message"]
    assert (await client.call("session.configure", {"session_id": sid, "operating_mode": "goal"}))["result"]
    assert (await client.call("session.configure", {"session_id": sid, "operating_mode": "agent"}))["result"]
    plan = await client.call("session.configure", {"session_id": sid, "operating_mode": "plan"})
    assert plan["result"]["operating_mode"] == "plan"
    records = await _records(client, sid)
    assert records[0]["operating_mode"] == "goal" and records[0]["rule_id"] == "mode.goal"
    assert records[0]["decided_by"] == "mode"


async def test_a_session_opens_in_goal(client: Client, workspace: Path) -> None:
    opened = await _open(client, workspace, operating_mode="goal")
    assert opened["operating_mode"] == "goal"


async def test_a_plugin_tool_in_a_contract_mode_is_refused_with_its_code(workspace: Path) -> None:
    spec = ToolSpec("plugin_demo_fetch", BashParams, "execute", "demo", plugin=True, plugin_risk="low")
    async with Sandbox.open(workspace, backend="fake", mode="auto", operating_mode="plan") as s:
        s.plugins.tools[spec.name] = spec  # as a registered plugin's tool is (sandbox.plugins)
        result = await s.call(spec.name, {"command": "echo hi"}, tool_call_id="p1")
        assert (result.ok, result.error_code) == (False, "PLUGIN_DISABLED_IN_PLAN")
        assert result.details["rule_id"] == "mode.plugin-disabled"
        s.configure(operating_mode="agent")
        s.configure(operating_mode="goal")
        again = await s.call(spec.name, {"command": "echo hi"}, tool_call_id="p2")
        assert again.error_code == "PLUGIN_DISABLED_IN_PLAN"
        rows = [r for r in s.audit.rows() if r["session_id"] == s.session_id]
    assert [
        (r["operating_mode"], r["rule_id"], r["decided_by"], r["error_code"], r["total_ms"] >= 0) for r in rows
    ] == [
        ("plan", "mode.plugin-disabled", "mode", "PLUGIN_DISABLED_IN_PLAN", True),
        ("goal", "mode.plugin-disabled", "mode", "PLUGIN_DISABLED_IN_PLAN", True),
    ]
    assert all(r["duration_ms"] == 0.0 for r in rows)


# -- delegates ------------------------------------------------------------------------------------


async def test_a_delegate_calls_only_its_tools(client: Client, workspace: Path) -> None:
    sid = (await _open(client, workspace, mode="auto"))["session_id"]
    reader = {"name": "explorer", "source": "builtin"}
    call = {"session_id": sid, "tool": "Bash", "args": {"command": "echo hi"}, "delegate": reader}
    refused = (await client.call("tool.call", call))["result"]
    assert refused["error_code"] == "TOOL_DENIED" and refused["details"]["rule_id"] == "delegate.tool"
    assert "explorer" in refused["content"] and "Read, Glob, Grep, LS" in refused["content"]
    shell = {"name": "runner", "source": "user", "tools": ["Bash", "Task", "plugin_x_y"]}
    ran = (await client.call("tool.call", {**call, "delegate": shell}))["result"]
    assert ran["ok"], ran
    assert len(ran["details"]["delegate_warnings"]) == 2 and "'Task' dropped" in ran["details"]["delegate_warnings"][0]
    records = await _records(client, sid)
    assert [(r["delegate"], r["rule_id"], r["decision"]) for r in records] == [
        ("explorer", "delegate.tool", "deny"),
        ("runner", "exempt.read-only", "allow"),
    ]
    bad = await client.call("tool.call", {**call, "delegate": {"name": "x", "source": "user", "scope": "auto"}})
    assert bad["error"]["code"] == -32602 and "delegate" in bad["error"]["message"]


async def test_a_delegates_permission_is_never_wider_than_its_session(client: Client, workspace: Path) -> None:
    sid = (await _open(client, workspace, mode="ask"))["session_id"]
    client.answer = {"decision": "deny"}
    wide = {"name": "yolo", "source": "user", "tools": "*", "permission": "auto"}
    call = {"session_id": sid, "tool": "Bash", "args": {"command": "touch x"}, "delegate": wide, "turn_id": "t1"}
    refused = (await client.call("tool.call", call))["result"]
    assert refused["error_code"] == "TOOL_DENIED"
    assert [a["delegate"] for a in client.approvals] == ["yolo"]  # asked, and the card names the delegate
    records = await _records(client, sid)
    assert (records[-1]["mode"], records[-1]["delegate"], records[-1]["prompted"]) == ("ask", "yolo", True)


async def test_a_narrower_delegate_is_asked_in_an_auto_session(client: Client, workspace: Path) -> None:
    sid = (await _open(client, workspace, mode="auto"))["session_id"]
    client.answer = {"decision": "allow-session"}
    careful = {"name": "careful", "source": "builtin", "tools": ["Bash"], "permission": "ask"}
    call = {"session_id": sid, "tool": "Bash", "args": {"command": "touch x"}, "delegate": careful}
    await client.call("tool.call", call)
    assert [(a["delegate"], a["allow_session"]) for a in client.approvals] == [("careful", True)]
    # The grant is the session's, per tool: another delegate (narrowed to ask too) is not asked again.
    other = {"name": "other", "source": "user", "tools": ["Bash"], "permission": "ask"}
    await client.call("tool.call", {**call, "delegate": other})
    assert len(client.approvals) == 1
    records = await _records(client, sid)
    assert [(r["delegate"], r["decided_by"], r["mode"]) for r in records] == [
        ("careful", "user", "ask"),
        ("other", "grant", "ask"),
    ]


async def test_a_project_delegate_cannot_declare_a_permission(client: Client, workspace: Path) -> None:
    sid = (await _open(client, workspace, mode="auto"))["session_id"]
    cloned = {"name": "repo-helper", "source": "project", "tools": ["Bash"], "permission": "ask"}
    call = {"session_id": sid, "tool": "Bash", "args": {"command": "touch x"}, "delegate": cloned}
    result = (await client.call("tool.call", call))["result"]
    assert not client.approvals  # the session's auto, not the dropped ask
    assert any("cannot declare" in w for w in result["details"]["delegate_warnings"])
    assert (await _records(client, sid))[-1]["mode"] == "auto"


# -- project trust --------------------------------------------------------------------------------


def _project_policy(workspace: Path) -> Path:
    path = workspace / PROJECT_POLICY
    path.parent.mkdir()
    path.write_text('[policy]\nrules = [{ action = "block", text = "echo blocked" }]\n')
    return path


def _profile(trust: str) -> profiles.Profile:
    return profiles.load("default").with_overrides(**{"policy.default_project_trust": trust})


async def test_an_ignored_project_policy_is_told(client: Client, workspace: Path) -> None:
    path = _project_policy(workspace)
    opened = await _open(client, workspace, mode="auto")
    [notice] = opened["notices"]
    assert notice["code"] == "policy.project-ignored" and notice["file"] == str(path.resolve())
    assert "not trusted" in notice["message"] and "sandbox trust" in notice["message"]
    trusted = await _open(client, workspace, mode="auto", trust_project=True)
    assert trusted["notices"] == []
    plain = await _open(client, workspace.parent, mode="auto")  # no policy file: nothing to say
    assert plain["notices"] == []


async def test_ask_puts_the_question_to_the_approver(workspace: Path) -> None:
    path = _project_policy(workspace)
    asked: list[ApprovalRequest] = []

    def answer(reply: str) -> CallbackApprover:
        def ask(request: ApprovalRequest) -> str:
            asked.append(request)
            return reply

        return CallbackApprover(ask)

    blocked = {"command": "echo blocked"}
    async with Sandbox.open(workspace, profile=_profile("ask"), backend="fake", approver=answer("allow-session")) as s:
        assert s.notices == []
        assert (await s.call("Bash", blocked)).error_code == "TOOL_DENIED"  # the project's rule applies
    [request] = asked
    assert (request.tool, request.rule_id, request.resource) == ("ProjectTrust", "trust.ask", str(path.resolve()))
    assert TrustStore().entries() == {}  # this session only: nothing is stored
    async with Sandbox.open(workspace, profile=_profile("ask"), backend="fake", approver=answer("deny")) as s:
        assert [n["code"] for n in s.notices] == ["policy.project-ignored"]
        assert (await s.call("Bash", blocked)).ok
    assert len(asked) == 2


async def test_ask_without_anyone_to_ask_means_untrusted(workspace: Path) -> None:
    _project_policy(workspace)
    # The profile's unattended answer, even "allow", is no one's decision: the file stays ignored.
    unattended = _profile("ask").with_overrides(**{"policy.unattended": "allow"})
    async with Sandbox.open(workspace, profile=unattended, backend="fake") as s:
        assert [n["code"] for n in s.notices] == ["policy.project-ignored"]

    def fails(_request: ApprovalRequest) -> str:
        raise ConnectionError("no UI")

    async with Sandbox.open(workspace, profile=_profile("ask"), backend="fake", approver=CallbackApprover(fails)) as s:
        assert [n["code"] for n in s.notices] == ["policy.project-ignored"]


async def test_a_stored_decision_is_not_asked_again(workspace: Path) -> None:
    _project_policy(workspace)
    TrustStore().set(workspace, False)
    asked: list[ApprovalRequest] = []

    def ask(request: ApprovalRequest) -> str:
        asked.append(request)
        return "allow-once"

    approver = CallbackApprover(ask)
    async with Sandbox.open(workspace, profile=_profile("ask"), backend="fake", approver=approver) as s:
        assert [n["code"] for n in s.notices] == ["policy.project-ignored"]
    assert asked == []


async def test_always_and_never(workspace: Path) -> None:
    _project_policy(workspace)
    async with Sandbox.open(workspace, profile=_profile("always"), backend="fake") as s:
        assert s.notices == [] and (await s.call("Bash", {"command": "echo blocked"})).error_code == "TOOL_DENIED"
    async with Sandbox.open(workspace, profile=_profile("never"), backend="fake") as s:
        assert s.notices and (await s.call("Bash", {"command": "echo blocked"})).ok


async def test_a_pre_trust_handler_decides_first_and_the_session_says_who_decided(workspace: Path) -> None:
    """Seed 000 §10's pre-trust handler: an extension or client decides before the store and the
    profile's default; None defers to them. ``Sandbox.trust`` says the decision and its source."""
    _project_policy(workspace)
    TrustStore().set(workspace, False)  # stored: untrusted
    seen: list[Path] = []

    def trusting(where: Path) -> bool:
        seen.append(where)
        return True

    blocked = {"command": "echo blocked"}
    async with Sandbox.open(workspace, profile=_profile("never"), backend="fake", trust_handler=trusting) as s:
        assert (await s.call("Bash", blocked)).error_code == "TOOL_DENIED"  # the project's rule: loaded
        assert (s.trust["trusted"], s.trust["source"]) == (True, "handler") and "pre-trust handler" in s.trust["why"]
    assert seen == [workspace.resolve()]

    async def deferring(_where: Path) -> bool | None:
        return None

    async with Sandbox.open(workspace, profile=_profile("always"), backend="fake", trust_handler=deferring) as s:
        assert (await s.call("Bash", blocked)).ok  # the stored "untrusted" decides
        assert (s.trust["trusted"], s.trust["source"]) == (False, str(workspace.resolve()))
        assert s.trust["why"] == f"the stored decision for {workspace.resolve()}"
    async with Sandbox.open(workspace, profile=_profile("always"), backend="fake", trust_project=True) as s:
        assert s.trust["source"] == "override"  # the caller's word wins over a handler's too


async def test_sandbox_policy_show_and_trust_show_say_what_is_enforced(workspace: Path, tmp_path: Path) -> None:
    """What a session would enforce, read without opening one: the protected and trusted paths,
    domains and remotes, the network, and the project's trust with where it comes from."""
    import json
    import subprocess
    import sys

    profile = tmp_path / "mine.toml"
    profile.write_text(
        '[network]\nmode = "allowlist"\nallow = ["pypi.org"]\n'
        '[policy]\ndeny_read = ["secrets/**"]\n'
        '[policy.trusted]\npaths = ["build"]\ndomains = ["docs.python.org"]\ngit_remotes = ["origin"]\n'
    )
    _project_policy(workspace)

    def sandbox(*argv: str) -> str:
        done = subprocess.run(
            [sys.executable, "-c", "from sandbox.cli import entry; entry()", *argv],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        return done.stdout

    shown = json.loads(sandbox("policy", "show", "--workspace", str(workspace), "--profile", str(profile), "--json"))
    assert "secrets/**" in shown["protected"]["deny_read"] and "~/.ssh/**" in shown["protected"]["deny_read"]
    assert "~/.ssh/**" in shown["protected"]["deny_write"]
    assert shown["trusted"] == {"paths": ["build"], "domains": ["docs.python.org"], "git_remotes": ["origin"]}
    # What the proxy enforces: the profile's hosts, then its trusted domains (seed 004).
    assert (shown["network"]["mode"], shown["network"]["allow"]) == ("allowlist", ["pypi.org", "docs.python.org"])
    assert shown["project"]["exists"] and (shown["project"]["trusted"], shown["project"]["source"]) == (
        False,
        "default",
    )
    assert "default_project_trust = never" in shown["project"]["why"]
    sandbox("trust", str(workspace))
    said = sandbox("trust", "--show", str(workspace))
    assert said.startswith(f"trusted: {workspace.resolve()} (the stored decision for {workspace.resolve()})"), said


def test_an_old_audit_log_gains_the_new_columns(tmp_path: Path) -> None:
    import sqlite3

    from sandbox import audit

    path = tmp_path / "old.sqlite3"
    db = sqlite3.connect(path)
    added = ", operating_mode TEXT NOT NULL DEFAULT 'agent', delegate TEXT"
    assert added in audit._schema()
    db.execute(audit._schema().replace(added, ""))  # a schema-1 log
    old = [c for c in audit._COLUMNS if c not in ("operating_mode", "delegate")]
    db.execute(f"INSERT INTO calls ({', '.join(old)}) VALUES ({', '.join('?' * len(old))})", ["x"] * len(old))
    db.commit()
    db.close()
    log = AuditLog(path)
    try:
        columns = {row[1] for row in log._db.execute("PRAGMA table_info(calls)")}
        assert {"operating_mode", "delegate"} <= columns
        assert log._db.execute("SELECT operating_mode, delegate FROM calls").fetchone() == ("agent", None)
    finally:
        log.close()
