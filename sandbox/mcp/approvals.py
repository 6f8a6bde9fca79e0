"""Boundary 4 over MCP: a ``confirm`` put to the user through the client's elicitation, fail closed.

The question rides the tool call's own request (``related_request_id``), so over streamable HTTP
it reaches the client on that call's stream. What comes back: ``accept`` with a decision is that
decision; ``decline`` is the user's deny, unless it came back before anyone could have read the
question (:data:`UNREAD_S`): then the client refused by itself (``codex exec`` declines every
question, Claude Code's ``-p`` dismisses it), recorded as ``decided_by: client``. Everything else
is a denial :func:`sandbox.policy.approvals.decide` explains to the model: a client that did not declare
elicitation (no one to ask), a dismissed form (``cancel``), an error answer, a closed connection,
the MCP request cancelled while the question was open, and silence past the profile's
``policy.approval_timeout_s``.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import anyio
import mcp_types as types

from sandbox.policy.approvals import ApprovalUnavailable, Approver, ClientAnswered, NoOneToAsk

if TYPE_CHECKING:
    from mcp.server.context import ServerRequestContext

    from sandbox.policy.approvals import ApprovalRequest
    from sandbox.vocabulary import Answer

ELICITATION = types.ClientCapabilities(elicitation=types.ElicitationCapability())
# A refusal sooner than this after the question went out was the client program's, not a person's:
# nobody reads the card (tool, resource, reason) and answers within a quarter of a second.
UNREAD_S = 0.25
_REFUSALS = {"decline": "declined", "cancel": "dismissed"}
_CHOICES: dict[Answer, str] = {
    "allow-once": "Allow once",
    "allow-session": "Allow for this session",
    "deny": "Deny",
}


class PendingCall:
    """A tool call in flight: the request it came on, and its abort event."""

    def __init__(self, ctx: ServerRequestContext[Any, Any], abort: anyio.Event) -> None:
        self.ctx = ctx
        self.abort = abort


class ElicitationApprover(Approver):
    """Asks through the MCP request that made the call (looked up by the call's id)."""

    def __init__(self) -> None:
        self.calls: dict[str, PendingCall] = {}

    async def ask(self, request: ApprovalRequest) -> Answer:
        pending = self.calls.get(request.tool_call_id)
        if pending is None:  # no request to ask through (a connection opened while several calls run)
            raise NoOneToAsk("no MCP request is waiting on this question")
        if not pending.ctx.session.check_client_capability(ELICITATION):
            raise NoOneToAsk("the MCP client did not declare the elicitation capability")
        asked = time.monotonic()
        result = await self._elicit(pending, request)
        waited = time.monotonic() - asked
        if result.action in _REFUSALS and waited < UNREAD_S:
            refused = _REFUSALS[result.action]
            raise ClientAnswered(
                f"the MCP client {refused} the question itself, {waited * 1000:.0f} ms after it was sent"
            )
        if result.action == "decline":
            return "deny"
        if result.action != "accept":
            raise ApprovalUnavailable("the user dismissed the approval request")
        decision = (result.content or {}).get("decision")
        if decision not in _CHOICES or decision == "allow-session" and not request.allow_session:
            raise ApprovalUnavailable(f"the client answered {decision!r}, not one of the offered choices")
        answer: Answer = decision
        return answer

    async def _elicit(self, pending: PendingCall, request: ApprovalRequest) -> types.ElicitResult:
        """The elicitation, given up (ApprovalUnavailable) when the MCP request is cancelled meanwhile."""
        result: types.ElicitResult | None = None
        async with anyio.create_task_group() as tg:

            async def watch() -> None:
                await pending.abort.wait()
                tg.cancel_scope.cancel()

            tg.start_soon(watch)
            session = pending.ctx.session
            result = await session.elicit_form(message(request), schema(request), pending.ctx.request_id)
            tg.cancel_scope.cancel()
        if result is None:
            raise ApprovalUnavailable("the MCP request was cancelled while the user was asked")
        return result


def message(request: ApprovalRequest) -> str:
    where = " (outside the workspace)" if request.external else ""
    return (
        f"sandbox: {request.tool} wants to {request.operation}{where}:\n  {request.resource}\n"
        f"why: {request.reason}\nAllow it?"
    )


def schema(request: ApprovalRequest) -> dict[str, Any]:
    """A one-field form: the decision, as a titled single-select (allow-session only where offered)."""
    offered = [a for a in _CHOICES if a != "allow-session" or request.allow_session]
    return {
        "type": "object",
        "properties": {
            "decision": {
                "type": "string",
                "title": "Decision",
                "description": f"{request.tool}: {request.resource}",
                "oneOf": [{"const": a, "title": _CHOICES[a]} for a in offered],
            }
        },
        "required": ["decision"],
    }
