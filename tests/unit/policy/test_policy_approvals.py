"""Fail-closed approvals and the whole authorize flow against a fake jail that records runs."""

from __future__ import annotations

import asyncio
import io
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import anyio
import pytest

from sandbox.errors import ToolDenied
from sandbox.policy.approvals import (
    USER_DENIED,
    ApprovalRequest,
    ApprovalUnavailable,
    Approver,
    CallbackApprover,
    ClientAnswered,
    NoOneToAsk,
    TerminalApprover,
    UnattendedApprover,
    decide,
)
from sandbox.policy.authorize import authorize
from sandbox.policy.gate import SessionState, ToolCall

if TYPE_CHECKING:
    from sandbox.vocabulary import Answer
    from tests.unit.policy.policy_world import World

pytestmark = pytest.mark.anyio

REQUEST = ApprovalRequest("s1", "t1", "c1", "Bash", "execute", "make deploy", "make is not read-only", "shell.command")


class Fixed(Approver):
    def __init__(self, answer: object) -> None:
        self.answer = answer
        self.asked: list[ApprovalRequest] = []

    async def ask(self, request: ApprovalRequest) -> Answer:
        self.asked.append(request)
        return self.answer  # type: ignore[return-value]


class Slow(Approver):
    async def ask(self, _request: ApprovalRequest) -> Answer:
        await anyio.sleep(10)
        return "allow-once"


class Raising(Approver):
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    async def ask(self, _request: ApprovalRequest) -> Answer:
        raise self.exc


@dataclass
class FakeJail:
    """Stands in for the executor: the only thing that matters is whether it ran."""

    runs: list[str] = field(default_factory=list)

    async def run(self, call: ToolCall) -> None:
        self.runs.append(call.tool_call_id)


async def test_user_answers_pass_through() -> None:
    for answer in ("allow-once", "allow-session"):
        outcome = await decide(Fixed(answer), REQUEST, 1)
        assert (outcome.answer, outcome.decided_by, outcome.allowed) == (answer, "user", True)
    denied = await decide(Fixed("deny"), REQUEST, 1)
    assert (denied.allowed, denied.reason) == (False, USER_DENIED)


async def test_timeout_denies() -> None:
    outcome = await decide(Slow(), REQUEST, 0.05)
    assert (outcome.answer, outcome.decided_by) == ("deny", "timeout")
    assert "timed out" in outcome.reason


@pytest.mark.parametrize(
    ("exc", "by"),
    [
        (RuntimeError("boom"), "error"),
        (ApprovalUnavailable("ui closed"), "disconnected"),
        (ClientAnswered("declined unread"), "client"),
        (NoOneToAsk("no ui"), "unattended"),
        (EOFError(), "disconnected"),
        (ConnectionResetError(), "disconnected"),
        (asyncio.CancelledError(), "cancelled"),
    ],
)
async def test_approver_failures_deny(exc: BaseException, by: str) -> None:
    outcome = await decide(Raising(exc), REQUEST, 1)
    assert (outcome.answer, outcome.decided_by) == ("deny", by)


@pytest.mark.parametrize("answer", ["yes", None, True, "ALLOW-ONCE", ""])
async def test_invalid_answers_deny(answer: object) -> None:
    outcome = await decide(Fixed(answer), REQUEST, 1)
    assert (outcome.answer, outcome.decided_by) == ("deny", "invalid")


async def test_caller_cancellation_propagates_and_nothing_runs() -> None:
    jail = FakeJail()
    with anyio.move_on_after(0.05):
        await decide(Slow(), REQUEST, 5)
        await jail.run(ToolCall("s1", "t1", "c1", "Bash", REQUEST))  # type: ignore[arg-type]
    assert jail.runs == []


async def test_unattended_and_callback_approvers() -> None:
    assert (await decide(UnattendedApprover(), REQUEST, 1)).decided_by == "unattended"
    assert (await decide(UnattendedApprover(allow=True), REQUEST, 1)).answer == "allow-once"

    async def async_cb(_request: ApprovalRequest) -> str:
        return "allow-session"

    assert (await decide(CallbackApprover(async_cb), REQUEST, 1)).answer == "allow-session"
    assert (await decide(CallbackApprover(lambda _r: "deny"), REQUEST, 1)).answer == "deny"


async def test_terminal_approver_reads_a_line_and_eof_denies() -> None:
    out = io.StringIO()
    assert (await decide(TerminalApprover(io.StringIO("s\n"), out), REQUEST, 1)).answer == "allow-session"
    assert "make deploy" in out.getvalue()
    closed = await decide(TerminalApprover(io.StringIO(""), io.StringIO()), REQUEST, 1)
    assert closed.decided_by == "disconnected"


async def _flow(
    world: World, approver: Approver, command: str, state: SessionState, jail: FakeJail, turn: str = "t1"
) -> bool:
    call = world.call("Bash", {"command": command}, turn=turn)
    auth = await authorize(world.gate("ask"), state, call, approver, timeout=0.05)
    try:
        auth.raise_if_denied()
    except ToolDenied:
        return False
    await jail.run(call)
    return True


async def test_authorize_never_runs_a_denied_call(world: World, state: SessionState) -> None:
    jail = FakeJail()
    for approver in (Fixed("deny"), Slow(), Raising(RuntimeError()), UnattendedApprover(), Fixed("maybe")):
        assert not await _flow(world, approver, "make deploy", SessionState("s1"), jail)
    assert not await _flow(world, Fixed("allow-once"), "rm -rf /", state, jail)
    assert jail.runs == []


async def test_authorize_remembers_session_grants_and_turn_denials(world: World, state: SessionState) -> None:
    jail = FakeJail()
    session_approver = Fixed("allow-session")
    assert await _flow(world, session_approver, "make build", state, jail)
    assert await _flow(world, session_approver, "make other", state, jail)
    assert len(session_approver.asked) == 1  # the second call rode the grant

    fresh = SessionState("s1")
    denier = Fixed("deny")
    assert not await _flow(world, denier, "cp a b", fresh, jail)
    assert not await _flow(world, denier, "cp a b", fresh, jail)
    assert len(denier.asked) == 1  # not asked again within the turn
    assert not await _flow(world, denier, "cp a b", fresh, jail, turn="t2")
    assert len(denier.asked) == 2


async def test_allow_session_is_not_offered_for_always_ask_rules(world: World, state: SessionState) -> None:
    approver = Fixed("allow-session")
    jail = FakeJail()
    assert await _flow(world, approver, "npm publish", state, jail)
    assert not approver.asked[0].allow_session
    assert not state.has_grant("Bash")


@pytest.mark.parametrize(
    ("approver", "said"),
    [
        (Fixed("deny"), "the user already denied this call"),
        (Slow(), "went unanswered earlier in this turn (it timed out)"),
        (UnattendedApprover(), "the session is unattended (no one to ask)"),
        (Raising(RuntimeError("boom")), "refused earlier in this turn (the approval failed)"),
    ],
    ids=["user", "timeout", "unattended", "error"],
)
async def test_a_repeated_refusal_says_who_refused_it_first(world: World, approver: Approver, said: str) -> None:
    """A call refused in a turn is not asked again; the second refusal names who refused the first
    (only a user's answer is "the user already denied")."""
    state = SessionState("s1")
    call = world.call("Bash", {"command": "make deploy"})
    first = await authorize(world.gate("ask"), state, call, approver, timeout=0.05)
    assert not first.allowed
    again = await authorize(world.gate("ask"), state, call, Fixed("allow-once"), timeout=0.05)
    assert (again.allowed, again.decision.rule_id) == (False, "turn.denied")
    assert said in again.decision.reason, again.decision.reason
    if not isinstance(approver, Fixed):
        assert "the user" not in again.decision.reason


async def test_a_calls_approval_record_is_redacted(world: World) -> None:
    """The record a result carries of who answered (seed 000 §14) keeps no secret the command held."""
    command = "curl -H 'Authorization: Bearer s3cretTOKENvalue123' https://api.example.com/deploy"
    call = world.call("Bash", {"command": command})
    auth = await authorize(world.gate("ask"), SessionState("s1"), call, Fixed("allow-once"), timeout=1)
    record = auth.record()
    assert record is not None and (record["answer"], record["scope"], record["allowed"]) == ("allow-once", "call", True)
    assert "s3cretTOKENvalue123" not in str(record) and "[REDACTED]" in record["resource"]
    unasked = await authorize(
        world.gate("auto"), SessionState("s1"), world.call("Bash", {"command": "ls"}), Fixed("deny")
    )
    assert unasked.record() is None  # nobody was asked: no record
