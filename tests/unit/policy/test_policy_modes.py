"""Seed 003 §10 (the operating-mode matrix), §10.2 (delegates), §11 (plugin tools) and seed 004's
askTools, at the gate: what each decides before anyone is asked."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from sandbox.errors import PluginDisabledInPlan, ToolDenied
from sandbox.policy.authorize import Authorization, request_for
from sandbox.policy.delegates import DEFAULT_TOOLS, DELEGATE_TOOLS, Delegate

if TYPE_CHECKING:
    from sandbox.policy.gate import SessionState
    from tests.unit.policy.policy_world import World

WRITE = {"path": "src/new.py", "content": "x"}


def test_a_contract_modes_plugin_refusal_carries_its_own_code(world: World, state: SessionState) -> None:
    for operating in ("plan", "goal"):
        decision = world.gate("auto", operating_mode=operating).evaluate(world.call("plugin_demo_low", {}), state)
        assert (decision.level, decision.rule_id, decision.decided_by) == ("deny", "mode.plugin-disabled", "mode")
        assert decision.error_code == "PLUGIN_DISABLED_IN_PLAN" and decision.operating_mode == operating
        auth = Authorization(decision, False, decision.decided_by, decision.reason)
        with pytest.raises(PluginDisabledInPlan) as info:
            auth.raise_if_denied()
        assert info.value.code == "PLUGIN_DISABLED_IN_PLAN" and info.value.data["rule_id"] == "mode.plugin-disabled"
    # Any other refusal is TOOL_DENIED, the contract modes' Write refusal included.
    write = world.gate("auto", operating_mode="goal").evaluate(world.call("Write", WRITE), state)
    assert (write.rule_id, write.error_code, write.decided_by) == ("mode.goal", "TOOL_DENIED", "mode")
    with pytest.raises(ToolDenied):
        Authorization(write, False, write.decided_by, write.reason).raise_if_denied()


def test_a_grant_never_reopens_a_contract_mode(world: World, state: SessionState) -> None:
    state.grant_session("plugin_demo_high")
    state.grant_session("Write")
    gate = world.gate("auto", operating_mode="plan")
    assert gate.evaluate(world.call("plugin_demo_high", {}), state).level == "deny"
    assert gate.evaluate(world.call("Write", WRITE), state).level == "deny"


def test_ask_tools_are_never_granted_for_the_session(world: World, state: SessionState) -> None:
    gate = world.gate("ask", ask_tools=("Bash", "plugin_demo_medium"))
    state.grant_session("Bash")
    state.grant_session("plugin_demo_medium")
    for tool, args in (("Bash", {"command": "make test"}), ("plugin_demo_medium", {})):
        decision = gate.evaluate(world.call(tool, args), state)
        assert (decision.level, decision.grantable) == ("confirm", False), decision
        assert "always asked" in decision.reason
    # Without ask_tools the same grants answer.
    assert world.gate("ask").evaluate(world.call("Bash", {"command": "make test"}), state).decided_by == "grant"


def test_a_medium_plugin_tool_can_be_granted_for_the_session(world: World, state: SessionState) -> None:
    gate = world.gate("ask")
    call = world.call("plugin_demo_medium", {})
    assert gate.evaluate(call, state).level == "confirm"
    state.grant_session("plugin_demo_medium")
    assert gate.evaluate(call, state).decided_by == "grant"


# -- delegates ------------------------------------------------------------------------------------


def test_a_delegates_tools_resolve_as_the_seed_says() -> None:
    assert Delegate(name="d", source="user").resolve().tools == frozenset(DEFAULT_TOOLS)
    assert Delegate(name="d", source="user", tools="*").resolve().tools == frozenset(DELEGATE_TOOLS)
    odd = Delegate(name="d", source="user", tools=["Read", "Task", "plugin_demo_low", "Bash", "Read"]).resolve()
    assert odd.tools == frozenset({"Read", "Bash"})
    assert len(odd.warnings) == 2 and "'Task' dropped" in odd.warnings[0]
    with pytest.raises(ValueError, match="extra"):
        Delegate.model_validate({"name": "d", "source": "user", "scope": "auto"})
    with pytest.raises(ValueError, match="source"):
        Delegate.model_validate({"name": "d", "source": "repo"})


def test_a_delegate_calls_only_its_tools(world: World, state: SessionState) -> None:
    gate = world.gate("auto")
    reader = Delegate(name="reader", source="builtin").resolve()
    assert gate.evaluate(world.call("Read", {"path": "README.md"}, delegate=reader), state).level == "allow"
    refused = gate.evaluate(world.call("Bash", {"command": "ls"}, delegate=reader), state)
    assert (refused.level, refused.rule_id) == ("deny", "delegate.tool") and "reader" in refused.reason
    everything = Delegate(name="all", source="user", tools="*").resolve()
    assert gate.evaluate(world.call("Write", WRITE, delegate=everything), state).level == "allow"
    # A plugin tool is never assignable, whatever the definition says.
    plugin = Delegate(name="p", source="user", tools=["plugin_demo_low"]).resolve()
    assert gate.evaluate(world.call("plugin_demo_low", {}, delegate=plugin), state).rule_id == "delegate.tool"
    assert gate.evaluate(world.call("plugin_demo_low", {}, delegate=everything), state).rule_id == "delegate.tool"


@pytest.mark.parametrize(
    ("session", "declared", "source", "expected"),
    [
        ("auto", "ask", "user", "ask"),  # a narrower scope narrows
        ("auto", "accept-edits", "builtin", "accept-edits"),
        ("ask", "auto", "user", "ask"),  # never wider than the owner's session (the issue over the seed)
        ("accept-edits", "auto", "builtin", "accept-edits"),
        ("auto", "inherit", "user", "auto"),
        ("auto", "ask", "project", "auto"),  # a project's declaration is dropped: the session's mode
        ("ask", "auto", "project", "ask"),
    ],
)
def test_a_delegates_permission_is_never_wider_than_its_session(
    world: World, state: SessionState, session: str, declared: str, source: str, expected: str
) -> None:
    delegate = Delegate.model_validate({"name": "d", "source": source, "tools": "*", "permission": declared}).resolve()
    decision = world.gate(session).evaluate(world.call("Write", WRITE, delegate=delegate), state)
    assert decision.mode == expected
    assert decision.level == ("confirm" if expected == "ask" else "allow")
    assert bool(delegate.warnings) == (source == "project" and declared != "inherit")


def test_accept_edits_delegate_still_confirms_bash_and_external_paths(world: World, state: SessionState) -> None:
    delegate = Delegate(name="editor", source="user", tools="*", permission="accept-edits").resolve()
    gate = world.gate("auto")
    assert gate.evaluate(world.call("Write", WRITE, delegate=delegate), state).level == "allow"
    assert gate.evaluate(world.call("Bash", {"command": "make test"}, delegate=delegate), state).level == "confirm"
    outside = world.call("Read", {"path": f"{world.outside}/notes.txt"}, delegate=delegate)
    assert gate.evaluate(outside, state).rule_id == "path.external"
    assert gate.evaluate(outside, state).level == "confirm"
    # The session's own call, in auto, reads it without a card (seed 003 §4a).
    assert gate.evaluate(world.call("Read", {"path": f"{world.outside}/notes.txt"}), state).level == "allow"


def test_delegates_run_in_agent_mode_only(world: World, state: SessionState) -> None:
    delegate = Delegate(name="d", source="builtin", tools="*").resolve()
    for operating in ("plan", "goal"):
        gate = world.gate("auto", operating_mode=operating)
        # The matrix's own refusal first, then the delegate's.
        assert gate.evaluate(world.call("Write", WRITE, delegate=delegate), state).rule_id == f"mode.{operating}"
        read = gate.evaluate(world.call("Read", {"path": "README.md"}, delegate=delegate), state)
        assert (read.level, read.rule_id) == ("deny", "delegate.mode")


def test_a_delegates_grant_is_the_sessions(world: World, state: SessionState) -> None:
    """Seed 003 §10.2: allow-session stays per tool and per session, shared by the parent and every delegate."""
    gate = world.gate("ask")
    one = Delegate(name="one", source="user", tools="*").resolve()
    other = Delegate(name="other", source="user", tools=["Bash"]).resolve()
    bash = {"command": "make test"}
    assert gate.evaluate(world.call("Bash", bash, delegate=one), state).level == "confirm"
    state.grant_session("Bash")  # one's allow-session answer
    assert gate.evaluate(world.call("Bash", bash, delegate=other), state).decided_by == "grant"
    assert gate.evaluate(world.call("Bash", bash), state).decided_by == "grant"


def test_the_approval_request_names_the_delegate(world: World, state: SessionState) -> None:
    delegate = Delegate(name="test-runner", source="user", tools=["Bash"]).resolve()
    call = world.call("Bash", {"command": "make test"}, delegate=delegate)
    request = request_for(call, world.gate("ask").evaluate(call, state))
    assert request.delegate == "test-runner"
    plain = world.call("Bash", {"command": "make test"})
    assert request_for(plain, world.gate("ask").evaluate(plain, state)).delegate is None
