"""Plugin tools (seed 003 §11, seed 004 askTools) above the backend: manifests, arguments, grants,
per-session registries, the gate's word on a client's own tools, and the server's methods.

What runs in a real jail (JSON in and out, the read-only plugin directory, timeouts) is in
tests/integration/test_plugins.py.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest

from sandbox import plugins
from sandbox.errors import InvalidArgument, ToolDenied
from sandbox.policy.approvals import ApprovalRequest, CallbackApprover
from sandbox.session import Sandbox
from sandbox.tools import params as tool_params
from tests.conftest import make_profile
from tests.unit import fake_support

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from sandbox.backends.fake import FakeBackend
    from sandbox.vocabulary import OperatingMode
    from tests.unit.fake_support import Client

pytestmark = pytest.mark.anyio

SCHEMA = {"type": "object", "properties": {"text": {"type": "string"}, "n": {"type": "integer"}}, "required": ["text"]}


def write_plugin(root: Path, plugin_id: str = "echo", **tool: Any) -> Path:
    """A plugin directory with one tool ``say`` (override its manifest entries with ``tool``)."""
    directory = root / f"plugin-{plugin_id}"
    directory.mkdir(parents=True, exist_ok=True)
    entry = {"name": "say", "description": "say it", "parameters": SCHEMA, "risk": "low", "command": ["python3", "x"]}
    entry.update(tool)
    entry = {k: v for k, v in entry.items() if v is not None}
    manifest = directory / "plugin.json"
    manifest.write_text(json.dumps({"id": plugin_id, "tools": [entry]}))
    return manifest


def approver(answers: list[str], seen: list[ApprovalRequest]) -> CallbackApprover:
    def answer(request: ApprovalRequest) -> str:
        seen.append(request)
        return answers.pop(0) if answers else "deny"

    return CallbackApprover(answer)


# -- the manifest -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("risk", "expected", "warned"),
    [("low", "low", False), ("high", "high", False), (None, "medium", True), ("extreme", "medium", True)],
)
def test_a_missing_or_invalid_risk_is_medium_with_a_warning(
    tmp_path: Path, risk: str | None, expected: str, warned: bool
) -> None:
    plugin = plugins.Plugin.load(write_plugin(tmp_path, risk=risk))
    tool = plugin.tools["plugin_echo_say"]
    assert (tool.manifest.risk, tool.spec.plugin_risk, tool.spec.plugin) == (expected, expected, True)
    assert bool(plugin.warnings) is warned
    if warned:
        assert "medium" in plugin.warnings[0] and "say" in plugin.warnings[0]


def test_names_exposed_and_internal(tmp_path: Path) -> None:
    plugin = plugins.Plugin.load(write_plugin(tmp_path, "my.tools-v2"))
    (name,) = plugin.tools
    assert name == "plugin_my_tools_v2_say"
    assert plugin.tools[name].internal == "plugin.my.tools-v2.say"
    assert plugin.jail_dir == "/run/sandbox/plugins/my.tools-v2"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"command": []}, "tools.0.command"),
        ({"command": None}, "tools.0.command"),
        ({"name": "no spaces"}, "tools.0.name"),
        ({"parameters": {"type": "string"}}, "tools.0.parameters"),
        ({"parameters": {"type": "object", "properties": {"a": {"type": "nonsense"}}}}, "tools.0.parameters"),
        ({"timeout": 0}, "tools.0.timeout"),
        ({"comand": ["x"]}, "tools.0.comand"),
    ],
)
def test_a_bad_manifest_names_its_field(tmp_path: Path, change: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        plugins.Plugin.load(write_plugin(tmp_path, **change))
    assert field in [p["field"] for p in caught.value.data["problems"]], caught.value.data
    assert str(tmp_path) in caught.value.message


def test_bad_ids_unreadable_files_and_duplicates_are_refused(tmp_path: Path) -> None:
    bad_id = tmp_path / "bad" / "plugin.json"
    bad_id.parent.mkdir()
    bad_id.write_text(json.dumps({"id": "../up", "tools": [{"name": "a", "command": ["x"]}]}))
    not_json = tmp_path / "nj.json"
    not_json.write_text("{")
    for path in (bad_id, not_json, tmp_path / "missing.json"):
        with pytest.raises(InvalidArgument):
            plugins.Plugin.load(path)
    twice = tmp_path / "two" / "plugin.json"
    twice.parent.mkdir()
    twice.write_text(json.dumps({"id": "two", "tools": [{"name": "a", "command": ["x"]}] * 2}))
    with pytest.raises(InvalidArgument, match="two tools are named"):
        plugins.Plugin.load(twice)
    first, other = write_plugin(tmp_path / "a", "same.id"), write_plugin(tmp_path / "b", "same_id")
    with pytest.raises(InvalidArgument, match="ids must differ"):
        plugins.load_all([first, other])


def test_a_plugin_directory_holding_the_home_or_a_secret_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "p" / "home"
    (home / ".ssh").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    above_home = tmp_path / "p" / "plugin.json"
    above_home.write_text((write_plugin(tmp_path / "src")).read_text())
    with pytest.raises(InvalidArgument, match="holds your home"):
        plugins.Plugin.load(above_home)
    secret = home / ".ssh" / "plugin.json"
    secret.write_text(above_home.read_text())
    with pytest.raises(InvalidArgument, match="secret"):
        plugins.Plugin.load(secret)
    assert plugins.Plugin.load(write_plugin(home / "tools")).id == "echo"  # a directory of its own is fine


def test_arguments_are_checked_against_the_schema_with_problems_per_field(tmp_path: Path) -> None:
    plugin = plugins.Plugin.load(write_plugin(tmp_path))
    tools = {**tool_params.REGISTRY, **{n: t.spec for n, t in plugin.tools.items()}}
    good = tool_params.validate("plugin_echo_say", {"text": "hi", "extra": [1]}, tools=tools)
    assert isinstance(good, plugins.PluginArgs) and good.arguments() == {"text": "hi", "extra": [1]}
    with pytest.raises(InvalidArgument) as caught:
        tool_params.validate("plugin_echo_say", {"n": "x"}, tools=tools)
    problems = caught.value.data["problems"]
    assert {"field": "n", "problem": "'x' is not of type 'integer'"} in problems
    assert {"field": "(arguments)", "problem": "'text' is a required property"} in problems
    with pytest.raises(ToolDenied):
        tool_params.validate("plugin_echo_say", {"text": "hi"})  # not in the built-in registry


# -- registration in a session ----------------------------------------------------------------------


@pytest.fixture
def manifest(tmp_path: Path) -> Path:
    return write_plugin(tmp_path / "plugins", risk="high")


async def test_unattended_sessions_never_register(fake: FakeBackend, workspace: Path, manifest: Path) -> None:  # noqa: ARG001
    profile = make_profile("default", **{"policy.unattended": "allow"})  # even "allow" grants no plugin
    async with Sandbox.open(workspace, profile=profile, backend="fake", mode="auto", plugins=[manifest]) as s:
        result = await s.register_plugin("echo")
        assert (result["registered"], result["decided_by"]) == (False, "unattended")
        called = await s.call("plugin_echo_say", {"text": "hi"})
        assert (called.error_code, called.details.get("rule_id")) == ("TOOL_DENIED", "capability.unknown-tool")
        rows = s.audit.rows()
        assert [(r["tool"], r["decision"], r["rule_id"]) for r in rows][0] == (
            "plugin.echo",
            "deny",
            "plugin.unattended",
        )


@pytest.mark.parametrize(("answer", "registered"), [("allow-once", True), ("allow-session", True), ("deny", False)])
async def test_the_user_grants_registration_through_the_approver(
    fake: FakeBackend,  # noqa: ARG001
    workspace: Path,
    manifest: Path,
    answer: str,
    registered: bool,
) -> None:
    seen: list[ApprovalRequest] = []
    opened = Sandbox.open(workspace, backend="fake", mode="auto", plugins=[manifest], approver=approver([answer], seen))
    async with opened as s:
        assert [t["name"] for t in s.tools_listing()] == list(tool_params.REGISTRY)
        result = await s.register_plugin("echo", turn_id="t1")
        assert result["registered"] is registered
        (request,) = seen
        assert (request.operation, request.tool, request.rule_id, request.allow_session) == (
            "register",
            "plugin.echo",
            "plugin.register",
            False,
        )
        assert request.resource == "plugin_echo_say (risk high)"
        listed = [t["name"] for t in s.tools_listing()]
        assert ("plugin_echo_say" in listed) is registered
        (row,) = s.audit.rows()
        assert (row["tool"], row["operating_mode"], row["prompted"], row["ok"]) == (
            "plugin.echo",
            "agent",
            True,
            registered,
        )


async def test_a_grant_in_one_session_registers_nothing_in_another(
    fake: FakeBackend,  # noqa: ARG001
    workspace: Path,
    manifest: Path,
) -> None:
    seen: list[ApprovalRequest] = []
    ask = approver(["allow-once"], seen)
    async with (
        Sandbox.open(workspace, backend="fake", mode="auto", plugins=[manifest], approver=ask) as one,
        Sandbox.open(workspace, backend="fake", mode="auto", plugins=[manifest], approver=ask) as two,
    ):
        assert (await one.register_plugin("echo"))["registered"]
        assert "plugin_echo_say" in one.plugins.tools and "plugin_echo_say" not in two.plugins.tools
        assert "plugin_echo_say" not in tool_params.REGISTRY
        refused = await two.call("plugin_echo_say", {"text": "hi"})
        assert refused.error_code == "TOOL_DENIED" and len(seen) == 1


async def test_granted_up_front_registers_at_open_and_undeclared_grants_are_refused(
    fake: FakeBackend,  # noqa: ARG001
    workspace: Path,
    manifest: Path,
) -> None:
    async with Sandbox.open(workspace, backend="fake", plugins=[manifest], granted_plugins=["echo"]) as s:
        assert s.plugins.registered == {"echo"}
        assert s.audit.rows()[0]["rule_id"] == "plugin.granted"
    with pytest.raises(InvalidArgument, match="not declared"):
        await Sandbox.create(workspace, backend="fake", granted_plugins=["echo"])


async def test_plugin_tools_are_hidden_and_refused_in_plan_mode(
    fake: FakeBackend,  # noqa: ARG001
    workspace: Path,
    manifest: Path,
) -> None:
    opened = Sandbox.open(
        workspace, backend="fake", mode="auto", operating_mode="plan", plugins=[manifest], granted_plugins=["echo"]
    )
    async with opened as s:
        assert "plugin_echo_say" not in [t["name"] for t in s.tools_listing()]
        (listed,) = s.plugins_listing()  # the session's mode decides what is visible, not the caller
        assert (listed["registered"], listed["visible"]) == (True, False)
        refused = await s.call("plugin_echo_say", {"text": "hi"})
        assert refused.error_code == "PLUGIN_DISABLED_IN_PLAN", refused
        s.configure(operating_mode="agent")
        assert s.plugins_listing()[0]["visible"] is True
        assert "plugin_echo_say" in [t["name"] for t in s.tools_listing()]
        s.configure(operating_mode="goal")
        assert s.plugins_listing()[0]["visible"] is False
        assert "plugin_echo_say" not in [t["name"] for t in s.tools_listing()]


@pytest.mark.parametrize("operating_mode", ["plan", "goal"])
async def test_plan_and_goal_list_only_their_tools_and_say_when_bash_may_write(
    fake: FakeBackend,  # noqa: ARG001
    workspace: Path,
    operating_mode: OperatingMode,
) -> None:
    """Seed 003: plan and goal offer Read, Glob, Grep, LS and Bash; under auto, Bash still writes unasked."""
    async with Sandbox.open(workspace, backend="fake", mode="auto", operating_mode=operating_mode) as s:
        assert [t["name"] for t in s.tools_listing()] == ["Bash", "Read", "Glob", "Grep", "LS"]
        assert [n["code"] for n in s.notices] == ["mode.bash-may-write"]
        assert "Bash runs without asking" in s.mode_notices()[0]["message"]
        s.configure(mode="ask")
        assert s.mode_notices() == []
        s.configure(operating_mode="agent", mode="auto")
        assert s.mode_notices() == [] and [t["name"] for t in s.tools_listing()] == list(tool_params.REGISTRY)


# -- the client's own tools: tool.check ----------------------------------------------------------------


async def test_a_client_tool_is_a_medium_risk_plugin_tool_to_the_gate(fake: FakeBackend, workspace: Path) -> None:  # noqa: ARG001
    seen: list[ApprovalRequest] = []
    async with Sandbox.open(workspace, backend="fake", mode="ask", approver=approver(["allow-once"], seen)) as s:
        allowed = await s.check_tool("web_search", {"query": "x"}, tool_call_id="k1", turn_id="t1")
        denied = await s.check_tool("web_search", {"query": "y"}, tool_call_id="k2", turn_id="t1")
        assert (allowed.ok, denied.ok, denied.error_code) == (True, False, "TOOL_DENIED")
        assert [r.tool for r in seen] == ["web_search", "web_search"]
        assert seen[0].rule_id == "plugin.medium"
        collides = await s.check_tool("Bash", {})
        bad = await s.check_tool("rm -rf", {})
        assert (collides.error_code, bad.error_code) == ("INVALID_ARGUMENT", "INVALID_ARGUMENT")
        nothing = await s.call("web_search", {"query": "x"})  # checking never makes a tool callable
        assert nothing.error_code == "TOOL_DENIED"
        rows = s.audit.rows()
        assert [(r["tool_call_id"], r["decision"]) for r in rows[:2]] == [("k1", "allow-once"), ("k2", "deny")]
        assert rows[0]["duration_ms"] < 50


async def test_a_client_tool_is_refused_in_contract_modes_and_unattended(fake: FakeBackend, workspace: Path) -> None:  # noqa: ARG001
    async with Sandbox.open(workspace, backend="fake", mode="auto", operating_mode="goal") as s:
        refused = await s.check_tool("web_search", {})
        assert (refused.ok, refused.error_code) == (False, "PLUGIN_DISABLED_IN_PLAN")
    async with Sandbox.open(workspace, backend="fake", mode="ask") as s:
        assert (await s.check_tool("web_search", {})).error_code == "TOOL_DENIED"


async def test_ask_tools_forces_a_question_for_tools_the_policy_would_allow(
    fake: FakeBackend,  # noqa: ARG001
    workspace: Path,
    manifest: Path,
) -> None:
    low = write_plugin(manifest.parent.parent / "low", "lowrisk", risk="low")
    profile = make_profile(
        "default", **{"policy.medium_risk": "allow", "policy.ask_tools": ["web_search", "plugin_lowrisk_say"]}
    )
    seen: list[ApprovalRequest] = []
    opened = Sandbox.open(
        workspace,
        profile=profile,
        backend="fake",
        mode="auto",
        plugins=[low],
        granted_plugins=["lowrisk"],
        approver=approver(["allow-session", "deny", "deny"], seen),
    )
    async with opened as s:
        assert (await s.check_tool("fetch_page", {})).ok  # medium, allowed by policy: not asked
        assert seen == []
        assert (await s.check_tool("web_search", {}, turn_id="t1")).ok
        assert seen[-1].allow_session is False  # always asked: never granted for the session
        assert not (await s.check_tool("web_search", {}, turn_id="t2")).ok
        refused = await s.call("plugin_lowrisk_say", {"text": "hi"})  # low risk, but named in ask_tools
        assert refused.error_code == "TOOL_DENIED" and seen[-1].tool == "plugin_lowrisk_say"


# -- sandbox serve ----------------------------------------------------------------------------------------


@pytest.fixture
async def client() -> AsyncIterator[Client]:
    async with fake_support.serve() as c:
        yield c


async def test_serve_declares_registers_lists_and_checks(client: Client, workspace: Path, manifest: Path) -> None:
    opened = await client.call(
        "session.open", {"workspace": str(workspace), "backend": "fake", "mode": "ask", "plugins": [str(manifest)]}
    )
    sid = opened["result"]["session_id"]
    (declared,) = opened["result"]["plugins"]
    assert (declared["id"], declared["registered"], declared["tools"][0]["risk"]) == ("echo", False, "high")
    client.answer = {"decision": "deny"}
    refused = await client.call("plugin.register", {"session_id": sid, "plugin_id": "echo"})
    assert refused["result"]["registered"] is False and client.approvals[-1]["operation"] == "register"
    client.answer = {"decision": "allow-once"}
    granted = await client.call("plugin.register", {"session_id": sid, "plugin_id": "echo"})
    assert granted["result"]["registered"] is True
    listed = await client.call("tools.list", {"session_id": sid})
    say = next(t for t in listed["result"]["tools"] if t["name"] == "plugin_echo_say")
    assert say["parameters"] == SCHEMA and say["risk"] == "high"
    plugins_now = await client.call("plugin.list", {"session_id": sid})
    assert plugins_now["result"]["plugins"][0]["registered"] is True
    checked = await client.call("tool.check", {"session_id": sid, "tool": "web_search", "args": {"q": "x"}})
    assert checked["result"]["ok"] is True and client.approvals[-1]["tool"] == "web_search"
    unknown = await client.call("plugin.register", {"session_id": sid, "plugin_id": "nope"})
    assert unknown["error"]["data"]["code"] == "INVALID_ARGUMENT"
    bad = await client.call(
        "session.open", {"workspace": str(workspace), "backend": "fake", "plugins": [str(manifest.parent)]}
    )
    assert bad["error"]["data"]["code"] == "INVALID_ARGUMENT"


def test_serve_checks_its_plugin_flags_before_serving(tmp_path: Path, manifest: Path) -> None:
    import subprocess

    from tests.rpc_client import SANDBOX

    def serve(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([SANDBOX, "serve", *args], capture_output=True, text=True, input="", timeout=60)

    missing = serve("--plugin", str(tmp_path / "nope.json"))
    ungranted = serve("--plugin", str(manifest), "--grant-plugin", "other")
    assert missing.returncode != 0 and "nope.json" in missing.stderr
    assert ungranted.returncode != 0 and "--grant-plugin other" in ungranted.stderr
    schema = json.loads(serve("--schema", "--plugin", str(manifest), "--grant-plugin", "echo").stdout)
    assert schema["tools"]["plugin_echo_say"] == SCHEMA and "plugin.register" in schema["requests"]
    assert "plugin_echo_say" not in json.loads(serve("--schema", "--plugin", str(manifest)).stdout)["tools"]
