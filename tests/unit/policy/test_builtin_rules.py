"""The built-in rules as data (sandbox/policy/builtin-rules.toml): every rule's examples are decided
by that rule, in its layer, and turning a rule off by its id takes it out of the decision."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from sandbox.policy.gate import SessionState
from sandbox.policy.rules import BUILTIN_RULES, RuleSet

if TYPE_CHECKING:
    from tests.unit.policy.policy_world import World

LEVEL = {"deny": "deny", "ask": "confirm", "exempt": "allow"}

CASES = [(rule.id, rule.layer, example) for rule in BUILTIN_RULES for example in rule.examples]


def test_the_data_file_names_every_rule_with_examples() -> None:
    assert [rule.id for rule in BUILTIN_RULES][:3] == ["deny.format", "deny.raw-device", "deny.delete-root"]
    assert all(rule.examples and rule.description for rule in BUILTIN_RULES)
    assert {rule.layer for rule in BUILTIN_RULES} == {"deny", "ask", "exempt"}


@pytest.mark.parametrize(("rule_id", "layer", "command"), CASES, ids=[f"{r}:{c}" for r, _, c in CASES])
def test_each_example_is_decided_by_its_rule(world: World, rule_id: str, layer: str, command: str) -> None:
    decision = world.gate("auto").evaluate(world.call("Bash", {"command": command}), SessionState("s1"))
    assert (decision.rule_id, decision.level) == (rule_id, LEVEL[layer]), decision.reason


@pytest.mark.parametrize("rule_id", [rule.id for rule in BUILTIN_RULES if rule.layer == "ask"])
def test_an_ask_rule_turned_off_by_its_id_no_longer_decides(world: World, rule_id: str) -> None:
    (example, *_) = next(rule.examples for rule in BUILTIN_RULES if rule.id == rule_id)
    removed = world.gate("auto", rules=RuleSet(removed=frozenset({rule_id})))
    decision = removed.evaluate(world.call("Bash", {"command": example}), SessionState("s1"))
    assert decision.rule_id != rule_id, decision.reason
