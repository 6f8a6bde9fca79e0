"""A call cancelled while its approval is pending ends at once as ABORTED, and the audit says so.

``tool.cancel`` (JSON-RPC) and pi's abort set the call's abort event; MCP's
``notifications/cancelled`` cancels the request's task. Either way the question is withdrawn,
nothing runs, and one audit record says ``ABORTED`` (issue 33, item 4). Pure policy and
protocol: the fake backend.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio
import pytest

from sandbox.policy.approvals import ApprovalRequest, CallbackApprover
from sandbox.session import Sandbox

if TYPE_CHECKING:
    from pathlib import Path

    from sandbox.backends.fake import FakeBackend

pytestmark = pytest.mark.anyio


class Waiting:
    """An approver nobody answers: it records that it was asked, then waits for ever."""

    def __init__(self) -> None:
        self.asked = anyio.Event()
        self.withdrawn = False

    async def __call__(self, _request: ApprovalRequest) -> str:
        self.asked.set()
        try:
            await anyio.sleep_forever()
        finally:
            self.withdrawn = True
        raise AssertionError("unreachable")


def _rows(session: Sandbox, call_id: str) -> list[dict[str, Any]]:
    return [r for r in session.audit.rows() if r["tool_call_id"] == call_id]


async def test_an_abort_while_asked_ends_the_call_at_once(fake: FakeBackend, workspace: Path) -> None:  # noqa: ARG001
    waiting = Waiting()
    abort = anyio.Event()
    approver = CallbackApprover(waiting)
    async with Sandbox.open(workspace, profile="default", backend="fake", mode="ask", approver=approver) as s:
        async with anyio.create_task_group() as tg:

            async def cancel_when_asked() -> None:
                await waiting.asked.wait()
                abort.set()

            tg.start_soon(cancel_when_asked)
            with anyio.fail_after(5):  # at once, not after the approval's timeout
                result = await s.call("Write", {"path": "made.txt", "content": "x"}, tool_call_id="w1", abort=abort)
        assert (result.ok, result.error_code) == (False, "ABORTED")
        assert "waited for approval" in result.content
        assert waiting.withdrawn
        [row] = _rows(s, "w1")
        assert (row["error_code"], row["decided_by"], row["decision"]) == ("ABORTED", "cancelled", "deny")
    assert not (workspace / "made.txt").exists()


async def test_an_abort_before_the_question_asks_nobody(fake: FakeBackend, workspace: Path) -> None:  # noqa: ARG001
    waiting = Waiting()
    abort = anyio.Event()
    abort.set()
    async with Sandbox.open(
        workspace, profile="default", backend="fake", mode="ask", approver=CallbackApprover(waiting)
    ) as s:
        result = await s.call("Write", {"path": "made.txt", "content": "x"}, tool_call_id="w2", abort=abort)
        assert result.error_code == "ABORTED" and not waiting.asked.is_set()
        assert [r["error_code"] for r in _rows(s, "w2")] == ["ABORTED"]


async def test_a_cancelled_request_is_audited_as_aborted(fake: FakeBackend, workspace: Path) -> None:  # noqa: ARG001
    waiting = Waiting()
    async with Sandbox.open(
        workspace, profile="default", backend="fake", mode="ask", approver=CallbackApprover(waiting)
    ) as s:
        async with anyio.create_task_group() as tg:

            async def call() -> None:
                await s.call("Write", {"path": "made.txt", "content": "x"}, tool_call_id="w3")

            tg.start_soon(call)
            await waiting.asked.wait()
            tg.cancel_scope.cancel()  # as the MCP SDK cancels a request's handler
        [row] = _rows(s, "w3")
        assert (row["error_code"], row["decided_by"]) == ("ABORTED", "cancelled")
