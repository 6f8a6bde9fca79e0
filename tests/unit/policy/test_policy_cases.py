"""Table-driven policy cases: every ``cases/*.toml`` file, each case under every listed mode.

To add a case, append a ``[[case]]`` table to a file (or create a new file)::

    [[case]]
    name = "what it shows"
    command = "rm -rf /"              # a Bash command, or: tool = "Read" + args = { path = "{ws}/x" }
    modes = ["ask", "auto"]           # default: ask; "all" = ask, accept-edits, auto
    plan = false                      # the plan operating mode
    operating_mode = "goal"           # or any operating mode by name (agent, plan, goal)
    policy = { medium_risk = "allow" }  # optional: more of the profile's [policy] settings
    expect = "deny"                   # allow | confirm | deny
    rule = "deny.delete-root"         # optional: the rule that must decide

A ``tool`` named ``plugin_demo_<risk>`` is a plugin tool of that registered risk (``low``,
``medium``, ``high``; ``plugin_demo_unrated`` has none), taking any arguments.

Placeholders: {ws} {home} {app2} {outside} {scratch}. The world (conftest.py) has real files and
symlinks: ws/link_out -> outside, ws/notes_link.txt -> outside/notes.txt, ws/dangling.txt ->
outside/new.txt (missing), ws/src_link -> ws/src, ws/key_link -> ~/.ssh/id_rsa,
scratch/escape -> the parent of scratch. Files ``bypass*.toml`` must never come out as allow.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from sandbox.policy.gate import SessionState

if TYPE_CHECKING:
    from tests.unit.policy.policy_world import World

CASES_DIR = Path(__file__).parent / "cases"
ALL_MODES = ("ask", "accept-edits", "auto")


def _expand(case: dict[str, Any], source: str) -> list[tuple[str, dict[str, Any], str]]:
    modes = case.get("modes", ["ask"])
    modes = list(ALL_MODES) if modes == "all" else modes
    return [(f"{source}:{case['name']}[{mode}]", case, mode) for mode in modes]


def load_cases() -> list[tuple[str, dict[str, Any], str]]:
    cases = []
    for path in sorted(CASES_DIR.glob("*.toml")):
        for case in tomllib.loads(path.read_text(encoding="utf-8"))["case"]:
            case["_bypass"] = path.name.startswith("bypass")
            cases.extend(_expand(case, path.stem))
    return cases


CASES = load_cases()


def _fill(value: Any, world: World) -> Any:
    if isinstance(value, str):
        for key, path in world.placeholders().items():
            value = value.replace("{" + key + "}", path)
        return value
    if isinstance(value, dict):
        return {k: _fill(v, world) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, world) for v in value]
    return value


def test_there_are_enough_cases() -> None:
    assert len(CASES) >= 150


@pytest.mark.parametrize(("case_id", "case", "mode"), CASES, ids=[c[0] for c in CASES])
def test_case(case_id: str, case: dict[str, Any], mode: str, world: World) -> None:
    tool = case.get("tool", "Bash")
    args = _fill(case.get("args", {"command": case.get("command", "")}), world)
    operating = case.get("operating_mode", "plan" if case.get("plan", False) else "agent")
    gate = world.gate(mode=mode, operating_mode=operating, settings_table=case.get("policy"))
    decision = gate.evaluate(world.call(tool, args), SessionState("s1"))
    if case["_bypass"]:
        assert decision.level != "allow", f"bypass allowed: {decision}"
    assert decision.level == case["expect"], f"{case_id}: {decision.reason} ({decision.rule_id})"
    if "rule" in case:
        assert decision.rule_id == case["rule"], decision.reason
