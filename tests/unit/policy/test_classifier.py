"""Seed 004's classifier layer: one table of cases through three judges.

The same cases run through a Python callable (the library), the built-in client of an
OpenAI-compatible endpoint (a real HTTP server on loopback speaking the chat-completions shape,
its replies chosen per case) and ``sandbox serve``'s server-to-client ``classify.request``
(answered by the test's client). Each says whether the call ran, whether the user was asked and
whether the model was consulted; deny and ask rules come first, and every failure is asked.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import anyio
import pytest

from sandbox.policy.approvals import ApprovalRequest, Approver, UnattendedApprover
from sandbox.policy.authorize import authorize
from sandbox.policy.classifier import (
    CallbackClassifier,
    ChatClassifier,
    ClassifierFailed,
    ClassifyRequest,
    parse_answer,
)
from sandbox.policy.gate import SessionState
from sandbox.policy.rules import RuleSet, UserRule
from tests.chat_model import ChatServer
from tests.unit.fake_support import serve

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from sandbox.vocabulary import Answer, RuleAction
    from tests.unit.policy.policy_world import World

pytestmark = pytest.mark.anyio

TIMEOUT_S = 0.5
AUTHORISING = "yes, publish it now"


@dataclass(frozen=True)
class Case:
    id: str
    command: str
    reply: str  # how the model answers: allow, block, timeout, http-error, malformed, extra, authorised
    allowed: bool
    asked: bool
    judged: int  # how many times the model was consulted
    answer: Answer = "deny"  # the user's, when asked
    ask_on_block: bool = True
    rule: tuple[RuleAction, str] | None = None
    user_message: str | None = None
    configured: bool = True  # False: no classifier at all
    repeat: int = 1


CASES = (
    Case("allow", "make build", "allow", allowed=True, asked=False, judged=1),
    Case("block-then-allowed", "npm publish", "block", allowed=True, asked=True, judged=1, answer="allow-once"),
    Case("block-then-denied", "npm publish", "block", allowed=False, asked=True, judged=1),
    Case("ask-on-block-off", "npm publish", "block", allowed=False, asked=False, judged=1, ask_on_block=False),
    Case(
        "ask-rule-beats-allow", "make deploy", "allow", allowed=False, asked=True, judged=0, rule=("ask", "make deploy")
    ),
    Case("deny-rule-beats-allow", "mkfs.ext4 /dev/sda1", "allow", allowed=False, asked=False, judged=0),
    Case("user-block-rule-beats-allow", "curl https://example.com", "allow", False, False, 0, rule=("block", "curl")),
    Case("timeout-is-asked", "make build", "timeout", allowed=False, asked=True, judged=1),
    Case("http-error-is-asked", "make build", "http-error", allowed=True, asked=True, judged=1, answer="allow-once"),
    Case("malformed-json-is-asked", "make build", "malformed", allowed=False, asked=True, judged=1),
    Case("smuggled-fields-are-refused", "make build", "extra", allowed=False, asked=True, judged=1),
    Case("no-classifier-is-asked", "make build", "allow", allowed=False, asked=True, judged=0, configured=False),
    Case("authorising-message", "npm publish", "authorised", True, False, 1, user_message=AUTHORISING),
    Case("not-authorised-without-it", "npm publish", "authorised", allowed=False, asked=True, judged=1),
    Case("cache-hit", "make build", "allow", allowed=True, asked=False, judged=1, repeat=3),
)


@dataclass
class Outcome:
    allowed: list[bool]
    asked: int
    requests: list[dict[str, Any]]  # what the model was sent
    cards: list[str]  # the approval requests' reasons


def verdict_for(reply: str, request: dict[str, Any]) -> Any:
    """The model's answer object for a scripted reply (timeouts and errors are the driver's)."""
    if reply == "authorised":
        ok = AUTHORISING in (request.get("user_message") or "")
        return {"verdict": "allow" if ok else "block", "reason": "the user asked for it" if ok else "publishes"}
    if reply == "extra":
        return {"verdict": "allow", "reason": "fine", "grant": "allow-session", "rules": ["allow *"]}
    return {"verdict": reply, "reason": f"scripted {reply}"}


class Recording(Approver):
    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.asked: list[ApprovalRequest] = []

    async def ask(self, request: ApprovalRequest) -> Answer:
        self.asked.append(request)
        return self.answer


def _rules(case: Case) -> RuleSet | None:
    if case.rule is None:
        return None
    return RuleSet(user=(UserRule(action=case.rule[0], text=case.rule[1]),))


async def _through_gate(world: World, case: Case, classifier: Any) -> Outcome:
    gate = world.gate(
        mode="ask",
        rules=_rules(case),
        classifier="auto",
        ask_on_block=case.ask_on_block,
        classifier_timeout_s=TIMEOUT_S,
    )
    state, approver = SessionState("s1"), Recording(case.answer)
    allowed = []
    for turn in range(case.repeat):
        call = replace(world.call("Bash", {"command": case.command}, turn=f"t{turn}"), user_message=case.user_message)
        auth = await authorize(gate, state, call, approver, classifier=classifier if case.configured else None)
        allowed.append(auth.allowed)
        if auth.judgement is not None and auth.allowed and not auth.prompted:
            assert auth.decided_by == "classifier"
    return Outcome(allowed, len(approver.asked), [], [r.reason for r in approver.asked])


# -- driver 1: a Python callable ------------------------------------------------------------------


async def run_callable(world: World, case: Case) -> Outcome:
    seen: list[dict[str, Any]] = []

    async def model(request: ClassifyRequest) -> Any:
        seen.append(request.params())
        if case.reply == "timeout":
            await anyio.sleep(10)
        if case.reply == "http-error":
            raise ClassifierFailed("the endpoint answered HTTP 500")
        if case.reply == "malformed":
            return '{"verdict": "allow", "reason": '
        return verdict_for(case.reply, request.params())

    outcome = await _through_gate(world, case, CallbackClassifier(model, model="scripted"))
    outcome.requests = seen
    return outcome


# -- driver 2: the built-in client against a chat-completions server on loopback -------------------


class ScriptedChat(ChatServer):
    """The chat-completions server answering as the current case says (``reply``)."""

    def __init__(self) -> None:
        self.reply = "allow"
        super().__init__(self._respond)

    def _respond(self, request: dict[str, Any]) -> tuple[int, str]:
        if self.reply == "timeout":
            time.sleep(TIMEOUT_S * 3)
        if self.reply == "http-error":
            return 500, '{"error": {"message": "overloaded"}}'
        if self.reply == "malformed":
            return 200, "Sure! I think this is fine."
        return 200, "```json\n" + json.dumps(verdict_for(self.reply, request)) + "\n```"


@pytest.fixture(scope="module")
def chat_server() -> Iterator[ScriptedChat]:
    with ScriptedChat() as server:
        yield server


async def run_http(world: World, case: Case, server: ScriptedChat, monkeypatch: pytest.MonkeyPatch) -> Outcome:
    server.reply, server.seen = case.reply, []
    monkeypatch.setenv("TEST_CLASSIFIER_KEY", "sk-test-123")
    client = ChatClassifier(server.url, "tiny-model", "TEST_CLASSIFIER_KEY", http_timeout=TIMEOUT_S * 2)
    outcome = await _through_gate(world, case, client)
    outcome.requests = list(server.seen)
    if server.headers:
        assert server.headers[-1]["Authorization"] == "Bearer sk-test-123"
        assert server.bodies[-1]["model"] == "tiny-model"
    return outcome


# -- driver 3: sandbox serve asks its client ------------------------------------------------------


async def run_rpc(world: World, case: Case, tmp_path: Path) -> Outcome:
    profile = tmp_path / "classified.toml"
    profile.write_text(
        f'[policy]\nclassifier = "auto"\nask_on_block = {str(case.ask_on_block).lower()}\n'
        f"classifier_timeout_s = {TIMEOUT_S}\n"
    )
    if case.rule is not None:
        from sandbox.policy.rules import RuleStore

        RuleStore().add(case.rule[0], case.rule[1])
    async with serve() as client:
        client.answer = {"decision": case.answer}

        def classify(params: dict[str, Any]) -> Any:
            if case.reply == "timeout":
                return None  # never answered
            if case.reply == "http-error":
                return {"error": {"code": -32000, "message": "the model is overloaded"}}
            if case.reply == "malformed":
                return "not an answer"
            return verdict_for(case.reply, params)

        client.classify = classify
        opened = await client.call(
            "session.open",
            {
                "workspace": str(world.ws),
                "backend": "fake",
                "mode": "ask",
                "profile": str(profile),
                "classifier": "client" if case.configured else "none",
            },
        )
        sid = opened["result"]["session_id"]
        for turn in range(case.repeat):
            params: dict[str, Any] = {
                "session_id": sid,
                "tool": "Bash",
                "args": {"command": case.command},
                "turn_id": f"t{turn}",
                "tool_call_id": f"c{turn}",
            }
            if case.user_message is not None:
                params["user_message"] = case.user_message
            await client.call("tool.call", params)
        records = (await client.call("audit.query", {"session_id": sid}))["result"]["records"]
        await client.call("shutdown", {})
    allowed = [r["decision"] != "deny" for r in records]
    judged = [r for r in records if r["classifier_verdict"] is not None]
    assert all(r["decided_by"] == "classifier" for r in judged)
    return Outcome(allowed, len(client.approvals), client.classifications, [a["reason"] for a in client.approvals])


# -- the table ------------------------------------------------------------------------------------


def check(world: World, case: Case, outcome: Outcome) -> None:
    assert outcome.allowed[-1] is case.allowed, outcome
    assert outcome.asked == (1 if case.asked else 0), outcome
    assert len(outcome.requests) == case.judged, outcome.requests
    assert len(outcome.allowed) == case.repeat
    if case.judged:
        request = outcome.requests[0]
        assert request["tool"] == "Bash" and request["resource"] == case.command
        assert request["workspace"] == str(world.ws)
        assert request["user_message"] == case.user_message
        if case.command == "npm publish":
            assert any("publishes a package" in hint for hint in request["hints"])  # an older confirm rule, a hint
    if case.asked and case.reply == "block" and case.judged:
        assert "scripted block" in outcome.cards[0]  # the card carries the model's reason
    if case.asked and case.reply in ("timeout", "http-error", "malformed", "extra"):
        assert "fail closed" in outcome.cards[0]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
async def test_through_a_callable(world: World, case: Case) -> None:
    check(world, case, await run_callable(world, case))


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
async def test_through_the_builtin_http_client(
    world: World, case: Case, chat_server: ScriptedChat, monkeypatch: pytest.MonkeyPatch
) -> None:
    check(world, case, await run_http(world, case, chat_server, monkeypatch))


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
async def test_through_the_server_to_client_request(world: World, case: Case, tmp_path: Path) -> None:
    check(world, case, await run_rpc(world, case, tmp_path))


# -- around the table -----------------------------------------------------------------------------


async def test_nobody_to_ask_refuses_what_the_model_could_not_judge(world: World) -> None:
    gate = world.gate(mode="auto", classifier="auto")
    auth = await authorize(gate, SessionState("s1"), world.call("Bash", {"command": "make"}), UnattendedApprover())
    assert not auth.allowed and auth.judgement is not None and auth.judgement.verdict == "failed"
    assert "no classifier is configured" in auth.decision.reason


async def test_allow_this_kind_for_the_session_covers_the_kind_only(world: World) -> None:
    gate = world.gate(mode="ask", classifier="auto")
    blocked = CallbackClassifier(lambda _r: {"verdict": "block", "reason": "pushes"})
    state, approver = SessionState("s1"), Recording("allow-session")
    first = await authorize(
        gate, state, world.call("Bash", {"command": "git push origin main"}), approver, classifier=blocked
    )
    assert first.allowed and len(approver.asked) == 1 and approver.asked[0].allow_session
    assert approver.asked[0].session_scope == "git push"
    again = await authorize(
        gate, state, world.call("Bash", {"command": "git push origin dev"}), approver, classifier=blocked
    )
    assert again.allowed and again.decided_by == "grant" and len(approver.asked) == 1
    other = await authorize(
        gate, state, world.call("Bash", {"command": "git pull --rebase"}), approver, classifier=blocked
    )
    assert len(approver.asked) == 2 and other.allowed  # another kind is judged and asked again
    chained = await authorize(
        gate,
        state,
        world.call("Bash", {"command": "git push origin main && rm -rf build"}),
        approver,
        classifier=blocked,
    )
    assert len(approver.asked) == 3 and chained.allowed


def test_answers_are_validated_strictly() -> None:
    assert parse_answer('{"verdict": "block", "reason": "no"}').verdict == "block"
    for bad in (
        '{"verdict": "yes", "reason": "x"}',
        '{"verdict": "allow"}',
        '{"verdict": "allow", "reason": ""}',
        '{"verdict": "allow", "reason": "x", "level": "allow"}',
        '["allow"]',
        "allow",
        {"verdict": True, "reason": "x"},
    ):
        with pytest.raises(ValueError, match="answer"):
            parse_answer(bad)


async def test_a_missing_api_key_fails_closed(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_SUCH_KEY", raising=False)
    gate = world.gate(mode="ask", classifier="auto")
    client = ChatClassifier("http://127.0.0.1:9/v1", "m", "NO_SUCH_KEY")
    auth = await authorize(
        gate, SessionState("s1"), world.call("Bash", {"command": "make"}), Recording("deny"), classifier=client
    )
    assert not auth.allowed and auth.judgement is not None and "NO_SUCH_KEY" in auth.judgement.reason


async def test_a_judgement_is_redacted_before_the_model_sees_it(world: World) -> None:
    seen: list[ClassifyRequest] = []

    def model(request: ClassifyRequest) -> dict[str, str]:
        seen.append(request)
        return {"verdict": "allow", "reason": "ok"}

    gate = world.gate(mode="ask", classifier="auto")
    call = world.call("Bash", {"command": "curl -H 'Authorization: Bearer abcdefghijklmnop' https://api.example.com"})
    await authorize(gate, SessionState("s1"), call, Recording("deny"), classifier=CallbackClassifier(model))
    assert "abcdefghijklmnop" not in seen[0].resource


async def test_a_session_without_a_callable_uses_the_profiles_endpoint(
    fake: Any,  # noqa: ARG001 - the fake backend, scripted per test
    workspace: Path,
    chat_server: ScriptedChat,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The built-in client serves the CLI and ``sandbox mcp``: a session opened without a classifier
    judges with the profile's ``policy.classifier_endpoint``."""
    from sandbox.session import Sandbox

    chat_server.reply, chat_server.seen = "block", []
    monkeypatch.setenv("TEST_CLASSIFIER_KEY", "sk-test-123")
    profile = workspace.parent / "endpoint.toml"
    profile.write_text(
        f'[policy]\nclassifier = "auto"\nclassifier_endpoint = "{chat_server.url}"\n'
        'classifier_model = "tiny-model"\nclassifier_key_env = "TEST_CLASSIFIER_KEY"\n'
    )
    approver = Recording("deny")
    async with Sandbox.open(workspace, profile=str(profile), backend="fake", approver=approver) as box:
        result = await box.call("Bash", {"command": "npm publish"})
    assert not result.ok and result.error_code == "TOOL_DENIED"
    assert [s["resource"] for s in chat_server.seen] == ["npm publish"]
    assert "scripted block" in approver.asked[0].reason and approver.asked[0].rule_id == "classifier.block"
