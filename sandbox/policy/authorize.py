"""Boundaries 3 and 4 together: evaluate, ask when needed, remember grants and denials."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from sandbox.errors import PluginDisabledInPlan, ToolDenied
from sandbox.policy.approvals import ApprovalRequest, Approver, decide
from sandbox.policy.classifier import MAX_USER_MESSAGE, ClassifyRequest, Judgement, judge
from sandbox.redaction import redact

if TYPE_CHECKING:
    from sandbox.policy.classifier import Classifier
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
    judgement: Judgement | None = None  # the classifier's, when it judged the call (seed 004)

    def record(self) -> dict[str, Any] | None:
        """The approval record of a call someone was asked about (seed 000: kept redacted, its scope
        said), for the call's result; ``None`` when nobody was asked."""
        if not self.prompted:
            return None
        return {
            "decided_by": self.decided_by,
            "answer": self.answer,
            "allowed": self.allowed,
            "rule_id": self.decision.rule_id,
            "resource": redact(self.decision.resource),
            "reason": redact(self.decision.reason),
            "scope": "session" if self.answer == "allow-session" else "call",
            "wait_ms": round(self.wait_ms, 1),
        }

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
        session_scope=_scope(decision.kind),
    )


def _scope(kind: str | None) -> str | None:
    """How a card names what "allow for this session" covers (the gate's ``Decision.kind``)."""
    if kind is None:
        return None
    tool, _, what = kind.partition(":")
    if what.startswith("="):
        return "this exact command"
    if tool == "Bash":
        return redact(what)
    return f"{tool} in {redact(what)}" if what else tool


def classify_request(gate: Gate, call: ToolCall, decision: Decision) -> ClassifyRequest:
    """What the classifier is asked, redacted as an approval card is."""
    message = call.user_message
    return ClassifyRequest(
        session_id=call.session_id,
        tool=call.name,
        operation=decision.operation,
        resource=redact(decision.resource),
        reason=redact(decision.reason),
        rule_id=decision.rule_id,
        hints=tuple(redact(hint) for hint in decision.hints),
        workspace=gate.paths.workspace,
        mode=decision.mode,
        operating_mode=decision.operating_mode,
        user_message=redact(message[-MAX_USER_MESSAGE:]) if message else None,
    )


async def judged(
    gate: Gate, state: SessionState, call: ToolCall, decision: Decision, classifier: Classifier | None
) -> Judgement:
    """The classifier's judgement of a call the rules left open; identical ones once per session."""
    request = classify_request(gate, call, decision)
    key = request.key()
    cached = state.judgements.get(key)
    if cached is not None:
        return replace(cached, cached=True, latency_ms=0.0)
    judgement = await judge(classifier, request, float(gate.settings.classifier_timeout_s))
    if judgement.verdict != "failed":  # a failure is tried again next time
        state.judgements[key] = judgement
    return judgement


async def authorize(
    gate: Gate,
    state: SessionState,
    call: ToolCall,
    approver: Approver,
    timeout: float | None = None,
    classifier: Classifier | None = None,
) -> Authorization:
    """Evaluate; a call the rules leave open is judged by ``classifier`` (seed 004: allow runs, a block
    is asked with the model's reason, or refused when ``ask_on_block`` is off; a failure is asked);
    a confirmation is put to ``approver``."""
    decision = gate.evaluate(call, state)
    judgement: Judgement | None = None
    if decision.level == "confirm" and decision.classify:
        judgement = await judged(gate, state, call, decision, classifier)
        if judgement.verdict == "allow":
            reason = f"the classifier ({judgement.model}) allowed it: {judgement.reason}"
            return Authorization(decision, True, "classifier", reason, judgement=judgement)
        if judgement.verdict == "block":
            decision = replace(
                decision, rule_id="classifier.block", reason=f"the classifier blocked it: {judgement.reason}"
            )
            if not gate.settings.ask_on_block:
                reason = f"{decision.reason} (not asked: the policy's ask_on_block is off)"
                state.note_denied(call.turn_id, call.name, decision.resource, "classifier")
                return Authorization(decision, False, "classifier", reason, judgement=judgement)
        else:
            decision = replace(
                decision,
                rule_id="classifier.failed",
                reason=f"{judgement.reason}; the call is asked instead (fail closed)",
            )
    if decision.level != "confirm":
        return Authorization(decision, decision.level == "allow", decision.decided_by, decision.reason)
    limit = timeout if timeout is not None else float(gate.settings.approval_timeout_s)
    outcome = await decide(approver, request_for(call, decision), limit)
    if outcome.answer == "allow-session" and decision.grantable:
        state.grant_session(decision.kind or call.name)
    elif outcome.answer == "deny":
        state.note_denied(call.turn_id, call.name, decision.resource, outcome.decided_by)
    # Only a question someone could see was a prompt: not an unattended refusal, nor a dead channel.
    prompted = outcome.decided_by in ("user", "timeout", "cancelled", "invalid")
    return Authorization(
        decision,
        outcome.allowed,
        outcome.decided_by,
        outcome.reason,
        outcome.answer,
        prompted,
        outcome.wait_ms,
        judgement,
    )
