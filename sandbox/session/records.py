"""A session's rows in its audit log: a call decided, a call refused before the gate, a registration.

Every call is audited whatever its outcome; these build each kind of row from what the session
measured and write it to the session's :class:`~sandbox.audit.AuditLog`. Apart from
:mod:`sandbox.session` because a row is bookkeeping, not flow: its times come from the caller's
clock (the session's for a call), so what a row says of a call's durations is decided where it runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sandbox.audit import AuditRecord, args_digest, args_preview
from sandbox.errors import Aborted, SandboxError, ToolDenied
from sandbox.plugins import registration_text

if TYPE_CHECKING:
    from sandbox.audit import AuditLog
    from sandbox.plugins import Plugin
    from sandbox.policy.approvals import ApprovalOutcome
    from sandbox.policy.authorize import Authorization
    from sandbox.policy.gate import Gate, SessionState, ToolCall
    from sandbox.tools.run import ToolResult
    from sandbox.vocabulary import Answer, DecidedBy


@dataclass(frozen=True)
class Recorder:
    """Writes one session's rows to ``log``; ``gate`` and ``state`` say its mode and policy version."""

    log: AuditLog
    session_id: str
    gate: Gate
    state: SessionState

    def decided(
        self, call: ToolCall, auth: Authorization, result: ToolResult, *, started: float, ran_at: float, now: float
    ) -> None:
        """A call past boundaries 1 and 2: decided, and run or refused (times from the session's clock)."""
        # Refused by the gate, the approver or the target recheck: the tool body never ran.
        refused = not auth.allowed or result.details.get("rule_id") == "path.changed"
        duration = 0.0 if refused else (now - ran_at) * 1000
        total = (now - started) * 1000
        overhead = max(0.0, total - duration - auth.wait_ms)
        record = AuditRecord.build(
            call,
            auth,
            duration_ms=round(duration, 3),
            overhead_ms=round(overhead, 3),
            total_ms=round(total, 3),
            ok=result.ok,
            error_code=result.error_code,
            policy_version=self.gate.policy_version,
        )
        if result.details.get("quarantined"):  # rw: what the call left that git would obey (gitsweep)
            record = dataclasses.replace(record, quarantined=json.dumps(result.details["quarantined"]))
        if "mutationFailureKind" in result.details:  # the repair loop's guard counted it (session.repair)
            record = dataclasses.replace(
                record,
                mutation_failure_kind=result.details["mutationFailureKind"],
                mutation_failure_attempt=result.details["mutationFailureAttempt"],
                terminate=result.details["terminate"],
            )
        self.log.record(record)

    def ended(self, call: ToolCall, exc: SandboxError, *, total: float, decided_by: DecidedBy) -> None:
        """A call that ended before it ran (cancelled while asked, or its request cancelled)."""
        with contextlib.suppress(SandboxError):
            self.rejected(
                call.name,
                call.params.model_dump(),
                call.tool_call_id,
                call.turn_id,
                exc,
                total=total,
                decided_by=decided_by,
            )

    def rejected(
        self,
        name: str,
        args: Any,
        call_id: str,
        turn_id: str,
        exc: SandboxError,
        *,
        total: float,
        decided_by: DecidedBy = "rule",
    ) -> None:
        """A call refused before the gate (an unknown tool, bad arguments) or ended before it ran."""
        data = args if isinstance(args, dict) else {"args": repr(args)}
        rule = "capability.unknown-tool" if isinstance(exc, ToolDenied) else "capability.params"
        if isinstance(exc, Aborted):
            rule = "call.cancelled"
        self.log.record(
            AuditRecord(
                self.session_id,
                turn_id,
                call_id,
                name,
                args_digest(data),
                args_preview(data),
                "",
                "",
                "none",
                "deny",
                "deny",
                decided_by,
                rule,
                self.gate.mode_for(self.state),
                False,
                0.0,
                0.0,
                total,
                total,
                False,
                exc.code,
                self.gate.policy_version,
                operating_mode=self.gate.settings.operating_mode,
            )
        )

    def registration(
        self,
        plugin: Plugin,
        call_id: str,
        turn_id: str,
        *,
        total: float,
        allowed: bool,
        rule_id: str,
        decided_by: DecidedBy = "rule",
        answer: Answer | None = None,
        wait_ms: float = 0.0,
    ) -> None:
        """A plugin's registration: asked (``plugin.register``), granted up front or refused unasked."""
        data = {"plugin": plugin.id, "manifest": str(plugin.path), "tools": sorted(plugin.tools)}
        prompted = decided_by in ("user", "timeout", "cancelled", "invalid")
        self.log.record(
            AuditRecord(
                self.session_id,
                turn_id,
                call_id,
                f"plugin.{plugin.id}",
                args_digest(data),
                args_preview(data),
                registration_text(plugin)[0],
                "",
                "none",
                "confirm" if rule_id == "plugin.register" else ("allow" if allowed else "deny"),
                (answer or "allow-once") if allowed else "deny",
                decided_by,
                rule_id,
                self.gate.mode_for(self.state),
                prompted,
                round(wait_ms, 3),
                0.0,
                max(0.0, round(total - wait_ms, 3)),
                total,
                allowed,
                None if allowed else "TOOL_DENIED",
                self.gate.policy_version,
            )
        )

    def state_change(
        self,
        operation: str,
        data: dict[str, Any],
        call_id: str,
        turn_id: str,
        *,
        total: float,
        error: Exception | None = None,
        asked: ApprovalOutcome | None = None,
    ) -> None:
        """A session snapshot, restore or fork (``session.snapshot`` …): ``data`` its ids and sizes;
        ``asked``: the approver's word, when it was asked."""
        code = error.code if isinstance(error, SandboxError) else ("TOOL_FAILED" if error else None)
        prompted = asked is not None
        wait_ms = asked.wait_ms if asked is not None else 0.0
        self.log.record(
            AuditRecord(
                self.session_id,
                turn_id,
                call_id,
                operation,
                args_digest(data),
                args_preview(data),
                str(data.get("snapshot_id", "")),
                "",
                "none",
                "confirm" if prompted else "allow",
                "deny" if isinstance(error, ToolDenied) else "allow-once",
                asked.decided_by if asked is not None else "mode",
                operation,
                self.gate.mode_for(self.state),
                prompted,
                round(wait_ms, 3),
                max(0.0, round(total - wait_ms, 3)),
                0.0,
                total,
                error is None,
                code,
                self.gate.policy_version,
                operating_mode=self.gate.settings.operating_mode,
            )
        )
