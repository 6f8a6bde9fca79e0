"""Capability and parameter boundaries, grants, turn denials, sessions, TOCTOU, mode resolution."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pytest

from sandbox.errors import InvalidArgument, ToolDenied
from sandbox.policy import live_rules
from sandbox.policy.gate import Gate, SessionState, ToolCall
from sandbox.policy.rules import RuleSet, RuleStore, UserRule
from sandbox.policy.trust import TrustStore
from sandbox.profile_policy import Policy
from sandbox.tools.params import REGISTRY, BashParams, lookup, validate

if TYPE_CHECKING:
    from tests.unit.policy.policy_world import World


def test_unknown_tool_is_denied_with_a_readable_reason() -> None:
    with pytest.raises(ToolDenied) as info:
        lookup("rm_everything")
    assert "unknown tool 'rm_everything'" in info.value.message
    assert "Read" in info.value.message


@pytest.mark.parametrize(
    ("tool", "args", "field"),
    [
        ("Bash", {"command": "ls", "timeout": 0.5}, "timeout"),
        ("Bash", {"command": "ls", "timeout": 301}, "timeout"),
        ("Bash", {"command": ""}, "command"),
        ("Read", {"path": "x", "offset": 0}, "offset"),
        ("Read", {"path": "x", "extra": 1}, "extra"),
        ("Edit", {"path": "x", "edits": []}, "edits"),
        ("Grep", {"pattern": "x", "limit": 1001}, "limit"),
        ("Grep", {"pattern": "x", "context": 21}, "context"),
        ("Write", {"path": "x"}, "content"),
    ],
)
def test_invalid_arguments_list_the_problems(tool: str, args: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        validate(tool, args)
    assert any(p["field"].startswith(field) for p in info.value.data["problems"])


def test_registry_risk_classes() -> None:
    assert {n: s.risk for n, s in REGISTRY.items()} == {
        "Bash": "execute",
        "Read": "read",
        "Write": "write",
        "Edit": "write",
        "Glob": "read",
        "Grep": "read",
        "LS": "read",
    }
    assert validate("Bash", {"command": "ls"}) == BashParams(command="ls", timeout=60)


def test_unvalidated_params_are_denied(world: World, state: SessionState) -> None:
    call = ToolCall("s1", "t1", "c1", "Read", BashParams(command="ls"))
    assert world.gate().evaluate(call, state).rule_id == "capability.params"


def test_allow_session_grant_is_per_tool_and_per_session(world: World) -> None:
    gate = world.gate("ask")
    one, other = SessionState("s1"), SessionState("s2")
    write = world.call("Write", {"path": "a.txt", "content": "x"})
    assert gate.evaluate(write, one).level == "confirm"
    one.grant_session("Write")
    assert gate.evaluate(write, one).level == "allow"
    assert gate.evaluate(world.call("Bash", {"command": "make"}), one).level == "confirm"
    other_call = world.call("Write", {"path": "a.txt", "content": "x"}, session="s2")
    assert gate.evaluate(other_call, other).level == "confirm"


def test_a_grant_never_covers_a_protected_path_or_an_ask_rule(world: World, state: SessionState) -> None:
    gate = world.gate("ask")
    state.grant_session("Write")
    state.grant_session("Bash")
    assert gate.evaluate(world.call("Write", {"path": ".git/hooks/x", "content": "x"}), state).level == "confirm"
    assert gate.evaluate(world.call("Bash", {"command": "npm publish"}), state).level == "confirm"


def test_a_grant_never_overrides_deny(world: World, state: SessionState) -> None:
    state.grant_session("Bash")
    assert world.gate("auto").evaluate(world.call("Bash", {"command": "rm -rf /"}), state).level == "deny"


@pytest.mark.parametrize("command", ["rm -rf /usr", "rm -rf /etc/*", "find /var -delete"])
def test_deleting_a_system_directory_is_asked_every_time_even_with_a_grant(
    world: World, state: SessionState, command: str
) -> None:
    state.grant_session("Bash")
    decision = world.gate("auto").evaluate(world.call("Bash", {"command": command}), state)
    assert (decision.level, decision.rule_id, decision.grantable) == ("confirm", "ask.delete-system-dir", False)


def test_the_system_directory_ask_is_a_removable_builtin(world: World, state: SessionState) -> None:
    gate = world.gate("auto", rules=RuleSet(removed=frozenset({"ask.delete-system-dir"})))
    # Still a write outside the workspace (issue 31): asked as that, no longer as a system directory.
    decision = gate.evaluate(world.call("Bash", {"command": "rm -rf /usr"}), state)
    assert (decision.level, decision.rule_id) == ("confirm", "path.external-write")
    assert gate.evaluate(world.call("Bash", {"command": "rm -rf /home/alice"}), state).level == "deny"


def test_state_of_another_session_is_refused(world: World) -> None:
    decision = world.gate().evaluate(world.call("Read", {"path": "README.md"}), SessionState("other"))
    assert (decision.level, decision.rule_id) == ("deny", "session.mismatch")


def test_denied_call_is_not_asked_again_in_the_same_turn(world: World, state: SessionState) -> None:
    gate = world.gate("ask")
    call = world.call("Bash", {"command": "make deploy"})
    decision = gate.evaluate(call, state)
    state.note_denied("t1", "Bash", decision.resource)
    again = gate.evaluate(call, state)
    assert (again.level, again.rule_id) == ("deny", "turn.denied")
    next_turn = world.call("Bash", {"command": "make deploy"}, turn="t2")
    assert gate.evaluate(next_turn, state).level == "confirm"


def test_mode_resolution_session_then_profile_then_global(world: World) -> None:
    call = world.call("Write", {"path": "a.txt", "content": "x"})
    assert world.gate(None).evaluate(call, SessionState("s1")).mode == "ask"
    gate = world.gate(None)
    gate.global_mode = "auto"
    assert gate.evaluate(call, SessionState("s1")).mode == "auto"
    assert world.gate("accept-edits").evaluate(call, SessionState("s1", mode="ask")).mode == "ask"


def test_recheck_denies_when_the_target_changed_after_approval(world: World, state: SessionState) -> None:
    gate = world.gate("ask")
    call = world.call("Write", {"path": "fresh.txt", "content": "x"})
    decision = gate.evaluate(call, state)
    assert decision.root == "workspace"
    gate.recheck(decision, call.params)  # unchanged: fine
    os.symlink(world.outside / "planted.txt", world.ws / "fresh.txt")
    with pytest.raises(ToolDenied) as info:
        gate.recheck(decision, call.params)
    assert info.value.data["rule_id"] == "path.changed"


def test_user_rules_for_bash_and_files(world: World, state: SessionState) -> None:
    rules = RuleSet(
        user=(
            UserRule(action="allow", text="make test"),
            UserRule(action="block", text="curl"),
            UserRule(action="ask", text="rm -rf"),
            UserRule(action="block", tool="Write", path="docs/**"),
            UserRule(action="allow", tool="Read", path=f"{world.app2}/**"),
        )
    )
    gate = world.gate("ask", rules=rules)
    assert gate.evaluate(world.call("Bash", {"command": "make test"}), state).level == "allow"
    # An allow rule matches one simple command, never the whole line.
    assert gate.evaluate(world.call("Bash", {"command": "make test; make deploy"}), state).level == "confirm"
    assert gate.evaluate(world.call("Bash", {"command": "ls && curl x"}), state).level == "deny"
    fr = gate.evaluate(world.call("Bash", {"command": "rm --force --recursive build"}), state)
    assert fr.level == "confirm" and fr.rule_id.startswith("user.ask.")
    assert not fr.grantable
    assert gate.evaluate(world.call("Write", {"path": "docs/a.md", "content": "x"}), state).level == "deny"
    assert gate.evaluate(world.call("Read", {"path": f"{world.app2}/secret.txt"}), state).level == "allow"


def test_builtin_rules_can_be_removed_by_id(world: World, state: SessionState) -> None:
    gate = world.gate("auto", rules=RuleSet(removed=frozenset({"ask.publish"})))
    assert gate.evaluate(world.call("Bash", {"command": "npm publish"}), state).level == "allow"
    strict = world.gate("ask", rules=RuleSet(removed=frozenset({"exempt.read-only"})))
    assert strict.evaluate(world.call("Bash", {"command": "ls"}), state).level == "confirm"


def test_profile_extends_protected_paths(world: World, state: SessionState) -> None:
    gate = world.gate("auto", deny_read=("secrets/**",), confirm_write=("*.lock",))
    assert gate.evaluate(world.call("Read", {"path": "secrets/a"}), state).level == "deny"
    assert gate.evaluate(world.call("Write", {"path": "poetry.lock", "content": ""}), state).level == "confirm"
    relaxed = world.gate("ask", deny_read=("!.env",))
    assert relaxed.evaluate(world.call("Read", {"path": ".env"}), state).level == "allow"


def test_plugin_tools_are_denied_in_plan(world: World, state: SessionState) -> None:
    from sandbox.tools import params

    spec = params.ToolSpec("plugin_demo_run", BashParams, "execute", "demo", plugin=True, plugin_risk="high")
    params.register(spec)
    try:
        call = ToolCall("s1", "t1", "c1", spec.name, BashParams(command="x"))
        refused = world.gate("auto", plan=True).evaluate(call, state)
        assert (refused.rule_id, refused.error_code) == ("mode.plugin-disabled", "PLUGIN_DISABLED_IN_PLAN")
        assert world.gate("ask").evaluate(call, state).level == "confirm"
        assert world.gate("auto").evaluate(call, state).level == "allow"
    finally:
        params.unregister(spec.name)


def test_rules_saved_while_a_session_runs_reach_it_at_its_next_call(world: World) -> None:
    """Seed 004: saved configuration takes effect at once; a half-saved store fails closed."""
    store = RuleStore(world.data / "policy" / "rules.json")
    settings = Policy.model_validate({"mode": "auto"})
    gate = Gate(
        world.ws,
        world.scratch,
        settings,
        data_dir=world.data,
        live=live_rules(settings, world.ws, store=store, trust=TrustStore(world.data / "policy" / "trust.json")),
    )
    state = SessionState("s1")
    call = world.call("Bash", {"command": "curl https://example.com"})
    assert gate.evaluate(call, state).level == "allow"
    rule = store.add("block", "curl")
    blocked = gate.evaluate(call, state)
    assert (blocked.level, blocked.rule_id) == ("deny", rule.id)
    store.path.write_text("{not json")
    broken = gate.evaluate(call, state)
    assert (broken.level, broken.rule_id) == ("deny", "policy.unreadable") and str(store.path) in broken.reason
    store.path.unlink()
    assert gate.evaluate(call, state).level == "allow"
    store.set_mode("accept-edits")  # the user's global mode, read again too
    gate.evaluate(call, state)
    assert gate.global_mode == "accept-edits"
