"""Audit hygiene through a session on the fake backend: what the user is asked and what the log keeps.

The clock is the module's, replaced: every reading of ``sandbox.session``'s monotonic clock is one
second after the last, so a body time that was measured is 1000 ms or more and one that was not is 0.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import TYPE_CHECKING, Any

import pytest

from sandbox import session as session_module
from sandbox.backends.fake import FakeBackend, FakeJail
from sandbox.policy.approvals import ApprovalRequest, CallbackApprover
from sandbox.session import Sandbox

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable
    from pathlib import Path

pytestmark = pytest.mark.anyio

API_KEY = "k3y-0f-th3-acc0unt"


class TickingClock:
    """Stands in for the ``time`` module in ``sandbox.session``."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        self.now += 1.0
        return self.now

    def time(self) -> float:
        return time.time()


@pytest.fixture
def asked() -> list[ApprovalRequest]:
    return []


@pytest.fixture
def answer() -> list[Callable[[ApprovalRequest], str]]:
    """The approver's behaviour, set by a test (the default denies)."""
    return [lambda _request: "deny"]


@pytest.fixture
async def session(
    fake: FakeBackend,  # noqa: ARG001 - scripts the shared fake
    workspace: Path,
    asked: list[ApprovalRequest],
    answer: list[Callable[[ApprovalRequest], str]],
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[Sandbox]:
    def ask(request: ApprovalRequest) -> str:
        asked.append(request)
        return answer[0](request)

    approver = CallbackApprover(ask)
    async with Sandbox.open(workspace, profile="default", backend="fake", mode="ask", approver=approver) as s:
        monkeypatch.setattr(session_module, "time", TickingClock())
        yield s


def row(session: Sandbox, tool_call_id: str) -> dict[str, Any]:
    (found,) = [r for r in session.audit.rows() if r["tool_call_id"] == tool_call_id]
    return found


async def test_a_call_the_gate_refuses_records_no_body_time(session: Sandbox) -> None:
    result = await session.call("Bash", {"command": "rm -rf /"}, tool_call_id="gate")
    record = row(session, "gate")
    assert (result.error_code, record["decided_by"]) == ("TOOL_DENIED", "rule")
    assert (record["duration_ms"], record["total_ms"]) == (0.0, 2000.0)
    assert record["overhead_ms"] == 2000.0 - record["permission_wait_ms"]


async def test_a_call_the_user_refuses_records_no_body_time(session: Sandbox) -> None:
    result = await session.call("Bash", {"command": "touch made.txt"}, tool_call_id="user")
    record = row(session, "user")
    assert (result.error_code, record["decided_by"], record["prompted"]) == ("TOOL_DENIED", "user", True)
    assert (record["duration_ms"], record["total_ms"]) == (0.0, 2000.0)


async def test_a_call_whose_target_changed_after_approval_records_no_body_time(
    session: Sandbox, answer: list[Callable[[ApprovalRequest], str]]
) -> None:
    ws = session.workspace
    (ws / "a.txt").write_text("a")
    (ws / "b.txt").write_text("b")
    (ws / "link.txt").symlink_to(ws / "a.txt")

    def allow_then_swap(_request: ApprovalRequest) -> str:
        (ws / "link.txt").unlink()
        (ws / "link.txt").symlink_to(ws / "b.txt")
        return "allow-once"

    answer[0] = allow_then_swap
    result = await session.call("Write", {"path": "link.txt", "content": "x"}, tool_call_id="swap")
    assert (result.error_code, result.details["rule_id"]) == ("TOOL_DENIED", "path.changed")
    assert isinstance(session.jail, FakeJail) and session.jail.processes == []
    assert row(session, "swap")["duration_ms"] == 0.0


async def test_a_call_that_ran_records_its_body_time(session: Sandbox) -> None:
    result = await session.call("Bash", {"command": "echo hi"}, tool_call_id="ran")
    assert result.ok
    assert row(session, "ran")["duration_ms"] == 1000.0


async def test_the_approval_request_is_redacted(session: Sandbox, asked: list[ApprovalRequest]) -> None:
    command = f"curl -H 'X-Api-Key: {API_KEY}' -X POST https://api.example.com/v1/items"
    await session.call("Bash", {"command": command}, tool_call_id="card")
    (request,) = asked
    assert API_KEY not in request.resource and API_KEY not in request.reason
    assert "X-Api-Key: [REDACTED]" in request.resource and "https://api.example.com/v1/items" in request.resource
    assert API_KEY not in row(session, "card")["args_preview"]


async def test_a_refused_write_keeps_the_digest_and_size_of_its_content(session: Sandbox) -> None:
    body = "hello, audit\n" * 3
    await session.call("Write", {"path": "notes.txt", "content": body}, tool_call_id="w")
    preview = json.loads(row(session, "w")["args_preview"])
    digest = hashlib.sha256(body.encode()).hexdigest()
    assert preview == {"content": {"bytes": 39, "sha256": digest}, "path": "notes.txt"}
