"""Boundaries 3 and 4 together: evaluate, ask when needed, remember grants and denials."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sandbox.audit import redact
from sandbox.errors import PluginDisabledInPlan, ToolDenied
from sandbox.policy.approvals import ApprovalRequest, Approver, decide

if TYPE_CHECKING:
    from sandbox.policy.gate import Decision, Gate, SessionState, ToolCall
    from sandbox.vocabulary import Answer, DecidedBy


@dataclass(frozen=True, slots=True)
class Authorization:
    decision: Decision  # what the policy said before anyone was asked
    allowed: bool
    decided_by: DecidedBy  # the gate's word, or the approval's when someone was asked
    reason: str
    answer: Answer | None = None
    prompted: bool = False
    wait_ms: float = 0.0

    def raise_if_denied(self) -> None:
        if not self.allowed:
            # The contract modes' plugin refusal keeps its own code (seed 003 §11); every other is TOOL_DENIED.
            kind = PluginDisabledInPlan if self.decision.error_code == "PLUGIN_DISABLED_IN_PLAN" else ToolDenied
            raise kind(
                self.reason,
                rule_id=self.decision.rule_id,
                decided_by=self.decided_by,
                resource=self.decision.resource,
                tool=self.decision.tool,
            )


def request_for(call: ToolCall, decision: Decision) -> ApprovalRequest:
    """The question put to the user, redacted as the audit log is: an approval card is displayed and may be logged."""
    return ApprovalRequest(
        session_id=call.session_id,
        turn_id=call.turn_id,
        tool_call_id=call.tool_call_id,
        tool=call.name,
        operation=decision.operation,
        resource=redact(decision.resource),
        reason=redact(decision.reason),
        rule_id=decision.rule_id,
        root=decision.root,
        external=decision.external,
        allow_session=decision.grantable,
        delegate=call.delegate.name if call.delegate is not None else None,
    )


async def authorize(
    gate: Gate, state: SessionState, call: ToolCall, approver: Approver, timeout: float | None = None
) -> Authorization:
    decision = gate.evaluate(call, state)
    if decision.level != "confirm":
        return Authorization(decision, decision.level == "allow", decision.decided_by, decision.reason)
    limit = timeout if timeout is not None else float(gate.settings.approval_timeout_s)
    outcome = await decide(approver, request_for(call, decision), limit)
    if outcome.answer == "allow-session" and decision.grantable:
        state.grant_session(call.name)
    elif outcome.answer == "deny":
        state.note_denied(call.turn_id, call.name, decision.resource)
    # Only a question someone could see was a prompt: not an unattended refusal, nor a dead channel.
    prompted = outcome.decided_by in ("user", "timeout", "cancelled", "invalid")
    return Authorization(
        decision, outcome.allowed, outcome.decided_by, outcome.reason, outcome.answer, prompted, outcome.wait_ms
    )
