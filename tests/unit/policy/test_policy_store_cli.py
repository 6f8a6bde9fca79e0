"""Project trust, the rules store, the shell parser's fast path, and the CLI commands."""

from __future__ import annotations

import argparse
import json
import os
from typing import TYPE_CHECKING

import pytest

from sandbox.cli import policy as cli_policy
from sandbox.errors import InvalidArgument
from sandbox.policy import load_ruleset
from sandbox.policy.rules import RuleStore
from sandbox.policy.shell import _bashlex_parse, _fast_parse
from sandbox.policy.trust import TrustStore, project_rules
from sandbox.profile_policy import Policy

if TYPE_CHECKING:
    from pathlib import Path

    from tests.unit.policy.policy_world import World

PROJECT_FILE = """
mode = "auto"
remove_rules = ["deny.delete-root", "ask.publish"]
[[rules]]
action = "block"
text = "terraform destroy"
"""


def _project(world: World) -> None:
    (world.ws / ".sandbox").mkdir()
    (world.ws / ".sandbox" / "policy.toml").write_text(PROJECT_FILE)


def test_untrusted_project_file_is_ignored_with_a_notice(world: World) -> None:
    _project(world)
    rules = project_rules(world.ws, TrustStore(world.data / "trust.json"))
    assert rules.user == () and "not trusted" in rules.notices[0]


def test_trusted_project_file_loads_but_cannot_widen(world: World) -> None:
    _project(world)
    store = TrustStore(world.data / "trust.json")
    store.set(world.ws.parent, True)  # the nearest ancestor's decision applies
    rules = project_rules(world.ws, store)
    assert [r.text for r in rules.user] == ["terraform destroy"]
    assert rules.removed == {"ask.publish"}  # a deny rule is never removed by a project
    assert any("'mode'" in n for n in rules.notices)
    assert any("deny.delete-root" in n for n in rules.notices)


def test_revoke_and_one_run_override(world: World) -> None:
    _project(world)
    store = TrustStore(world.data / "trust.json")
    store.set(world.ws.parent, True)
    store.set(world.ws, False)
    assert not store.decision(world.ws).trusted
    assert store.decision(world.ws, override=True).source == "override"
    assert project_rules(world.ws, store, override=True).user


def test_symlinked_workspace_uses_the_canonical_directory(world: World) -> None:
    store = TrustStore(world.data / "trust.json")
    os.symlink(world.ws, world.root / "alias")
    store.set(world.root / "alias", True)
    assert store.decision(world.ws).trusted


def test_rule_store_add_remove_restore(world: World) -> None:
    store = RuleStore(world.data / "rules.json")
    rule = store.add("block", "  docker system prune ")
    assert store.ruleset().user[0].text == "docker system prune"
    assert store.add("block", "docker system prune").id == rule.id  # idempotent
    assert "disabled" in store.remove("ask.sudo")
    assert not store.ruleset().enabled("ask.sudo")
    store.restore("ask.sudo")
    assert store.ruleset().enabled("ask.sudo")
    assert "removed user rule" in store.remove(rule.id)
    with pytest.raises(InvalidArgument):
        store.remove("no.such.rule")


def test_load_ruleset_merges_profile_store_and_project(world: World) -> None:
    _project(world)
    store = RuleStore(world.data / "rules.json")
    store.add("ask", "make release")
    settings = Policy(rules=({"action": "allow", "text": "make test"},))
    rules = load_ruleset(settings, world.ws, store=store, trust=TrustStore(world.data / "t.json"), trust_override=True)
    assert [r.text for r in rules.user] == ["make test", "make release", "terraform destroy"]


FAST = [
    "ls",
    "git status && ls -la src | grep foo",
    "a | b | c; d || e && f",
    "grep 'a b' \"c d\" e",
    "ls -la",
    "cat a b c",
    "echo '*' ?",
    "x & y",
    "ls;",
    "pytest -q tests/unit",
    "rg -n 'foo|bar' src",
]


@pytest.mark.parametrize("command", FAST)
def test_fast_path_agrees_with_bashlex(command: str) -> None:
    fast = _fast_parse(command)
    assert fast is not None
    assert fast == _bashlex_parse(command)


@pytest.mark.parametrize(
    "command",
    ["FOO=1 ls", "ls $x", "ls > f", "if x; then y; fi", "a;; b", "ls\nrm x", "a |& b", "! ls", "echo `id`", "ls #c"],
)
def test_fast_path_defers_to_bashlex(command: str) -> None:
    assert _fast_parse(command) is None


def _cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="sandbox")
    cli_policy.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


def test_cli_policy_test_json(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    assert _cli(["policy", "test", "--workspace", str(world.ws), "--json", "--", "rm -rf /"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["decision"], out["rule_id"]) == ("deny", "deny.delete-root")
    assert _cli(["policy", "test", "--workspace", str(world.ws), "--mode", "auto", "--", "make"]) == 0
    assert capsys.readouterr().out.startswith("allow:")


def test_cli_policy_test_tool(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    args = json.dumps({"path": "../app2/secret.txt"})
    assert _cli(["policy", "test", "--workspace", str(world.ws), "--tool", "Read", "--args", args]) == 0
    assert capsys.readouterr().out.startswith("confirm:")
    assert _cli(["policy", "test", "--tool", "Nope", "--args", "{}"]) == 2
    assert _cli(["policy", "test", "--tool", "Read", "--args", "[1]"]) == 2
    assert _cli(["policy", "test", "--tool", "Read", "--args", '{"path": 3}']) == 2
    assert _cli(["policy", "test"]) == 2
    assert "sandbox:" in capsys.readouterr().err


def test_cli_rules_trust_and_audit(world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _cli(["policy", "block", "curl"]) == 0
    assert _cli(["policy", "test", "--workspace", str(world.ws), "--", "curl x"]) == 0
    assert capsys.readouterr().out.count("deny:") == 1
    assert _cli(["policy", "remove", "ask.sudo"]) == 0
    assert _cli(["policy", "remove", "nope"]) == 2
    assert _cli(["policy", "list", "--json"]) == 0
    assert _cli(["trust", str(world.ws)]) == 0
    assert _cli(["trust", "--list"]) == 0
    assert str(world.ws) in capsys.readouterr().out
    assert _cli(["trust", "--revoke", str(world.ws)]) == 0
    assert _cli(["trust", str(tmp_path / "missing")]) == 2
    capsys.readouterr()
    assert _cli(["audit", "stats", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["total"] == 0
    out = tmp_path / "audit.jsonl"
    assert _cli(["audit", "export", "--jsonl", "--output", str(out)]) == 0
    assert out.read_text() == ""
