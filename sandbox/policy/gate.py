"""Boundary 3: modes, risk levels, grants and the decision handed to the executor.

The gate reads only validated arguments. Deny always wins: no mode, grant or user rule turns a
denied call into an allowed one. Decisions are ``allow``, ``confirm`` (ask the user) or ``deny``;
see ``authorize`` for the whole flow including the approval.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from sandbox import datadir
from sandbox.errors import InvalidArgument, ToolDenied
from sandbox.policy import commands, exemptions
from sandbox.policy.classifierbash import HINT_RULES, bash_exemptions
from sandbox.policy.filetargets import RULE_LEVEL, first_rule, glob_base
from sandbox.policy.grantkinds import grant_kind
from sandbox.policy.paths import PathPolicy, ResolvedPath
from sandbox.policy.rules import RuleSet
from sandbox.tools.params import BashParams, GlobParams, ToolSpec, lookup

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from pathlib import Path

    from pydantic import BaseModel

    from sandbox.policy.classifier import Judgement
    from sandbox.policy.delegates import ResolvedDelegate
    from sandbox.policy.liverules import LiveRules
    from sandbox.policy.verdict import Finding
    from sandbox.vocabulary import (
        ClassifierMode,
        DecidedBy,
        ErrorCode,
        Escape,
        GateDecidedBy,
        Level,
        OperatingMode,
        Operation,
        PermissionMode,
        PluginRisk,
        Root,
    )

CONTRACT_MODES: frozenset[str] = frozenset({"plan", "goal"})  # seed 003 §10: no Write, Edit nor plugin tool


@dataclass(frozen=True, slots=True)
class ToolCall:
    session_id: str
    turn_id: str
    tool_call_id: str
    name: str
    params: BaseModel
    delegate: ResolvedDelegate | None = None  # the delegate making the call (seed 003 §10.2), if any
    user_message: str | None = None  # the user's latest message, for the classifier (seed 004)


@dataclass(frozen=True, slots=True)
class Decision:
    level: Level
    reason: str
    rule_id: str
    resource: str  # canonical path, or the command for Bash
    root: Root | None
    external: bool
    tool: str
    operation: Operation
    mode: PermissionMode
    grantable: bool = True  # False: an allow-session grant never covers this confirmation
    decided_by: GateDecidedBy = "rule"
    escape: Escape | None = None
    target: ResolvedPath | None = None
    error_code: ErrorCode = "TOOL_DENIED"  # what a denial answers (PLUGIN_DISABLED_IN_PLAN for a contract mode's)
    operating_mode: OperatingMode = "agent"
    classify: bool = False  # left open by the rules: the classifier judges it (level is confirm meanwhile)
    hints: tuple[str, ...] = ()  # the older confirm rules it matched, handed to the classifier
    kind: str | None = None  # what "allow this kind for the session" grants (else the tool)


EARLIER_REFUSALS: dict[str, str] = {
    "user": "the user already denied this call in this turn",
    "client": "the client declined this call for the user earlier in this turn (no one was asked)",
    "unattended": "this call was refused earlier in this turn: the session is unattended (no one to ask)",
    "timeout": "the question about this call went unanswered earlier in this turn (it timed out)",
    "cancelled": "the question about this call was cancelled earlier in this turn",
    "disconnected": "no one could be asked about this call earlier in this turn (the approval channel is gone)",
    "classifier": "the classifier blocked this call earlier in this turn",
    "error": "this call was refused earlier in this turn (the approval failed)",
    "invalid": "the answer about this call earlier in this turn was not one the sandbox understands",
}
"""A call refused earlier in the turn, said by who refused it: only a user's answer is "the user
denied"."""


@dataclass
class SessionState:
    """Grants and denials of one session; never shared with, nor inherited by, another session."""

    session_id: str
    mode: PermissionMode | None = None
    grants: set[str] = field(default_factory=set)
    _denied: dict[str, dict[tuple[str, str], DecidedBy]] = field(default_factory=dict)
    judgements: dict[str, Judgement] = field(default_factory=dict)  # the classifier's, by request key

    def grant_session(self, tool: str) -> None:
        self.grants.add(tool)

    def has_grant(self, tool: str) -> bool:
        return tool in self.grants

    def note_denied(self, turn_id: str, tool: str, resource: str, by: DecidedBy = "user") -> None:
        """This call was refused in this turn, and by whom (the user, a timeout, an unattended
        session, the classifier): it is not asked again in the turn."""
        self._denied.setdefault(turn_id, {})[(tool, resource)] = by

    def was_denied(self, turn_id: str, tool: str, resource: str) -> DecidedBy | None:
        """Who refused this call earlier in this turn, or ``None``."""
        return self._denied.get(turn_id, {}).get((tool, resource))

    def end_turn(self, turn_id: str) -> None:
        self._denied.pop(turn_id, None)


class Gate:
    def __init__(
        self,
        workspace: Path,
        scratch: Path,
        settings: Any,
        rules: RuleSet | None = None,
        global_mode: PermissionMode | None = None,
        *,
        data_dir: Path | None = None,
        live: LiveRules | None = None,
        programs: Sequence[str] = (),
    ) -> None:
        """``settings`` is a ``sandbox.profile_policy.Policy``; ``rules`` defaults to the profile's own.

        With ``live``, rules and the global mode saved while the session runs reach it at its next call.
        ``programs`` are the profile's ``env.workspace_path`` entries (relative to the workspace):
        the jail runs a command found there before the system's, so such a name is never exempt.
        """
        self.settings = settings
        self.programs = tuple(os.path.join(str(workspace), rel) for rel in programs)
        self.global_mode = global_mode
        # Boundary 1 as the gate sees it: a session with plugin tools of its own may swap in its registry.
        self.tools: Callable[[str], ToolSpec] = lookup
        self._roots = (workspace, scratch, data_dir if data_dir is not None else datadir.data_dir())
        self._use(rules if rules is not None else RuleSet.from_settings(settings))
        self._live = live
        self._seen = live.stamp() if live is not None else ()
        self._broken: str | None = None

    def _use(self, rules: RuleSet) -> None:
        workspace, scratch, state_dir = self._roots
        self.rules = rules
        self.paths = PathPolicy(
            workspace,
            scratch,
            deny_read=rules.deny_read,
            deny_write=rules.deny_write,
            confirm_write=rules.confirm_write,
            state_dir=state_dir,
        )
        self.policy_version = rules.version
        # Resolved once, when the policy is read: a symlink swapped in later does not move the trust.
        self.trusted = exemptions.trusted_directories(
            self.settings.trusted.paths, self.paths.workspace, self.paths.homes
        )
        self._file_rules = [r for r in rules.compiled(self.paths.homes) if r.paths is not None]

    def follow(self) -> None:
        """Reload the rules if a file they come from changed since they were read.

        A file that cannot be read any more (a half-saved edit) fails closed: every call is denied,
        naming the file, until it reads again.
        """
        if self._live is None:
            return
        stamp = self._live.stamp()
        if stamp == self._seen:
            return
        self._seen = stamp
        try:
            rules, mode = self._live.load()
        except InvalidArgument as exc:
            self._broken = exc.message
            return
        self._broken = None
        self._use(rules)
        self.global_mode = mode

    def classifier_mode(self) -> ClassifierMode:
        """The profile's ``policy.classifier``, then the user's global one, then ``off``."""
        mode: ClassifierMode = self.settings.classifier or self.rules.classifier or "off"
        return mode

    def mode_for(self, state: SessionState) -> PermissionMode:
        """Session setting, then the profile, then the global default (as it is now), then ``ask``."""
        if not (state.mode or self.settings.mode):
            self.follow()  # the user's global mode may have changed since the last call
        return self._mode(state)

    def _mode(self, state: SessionState) -> PermissionMode:
        """:meth:`mode_for` of rules already followed (a call's evaluation follows them first)."""
        mode: PermissionMode = state.mode or self.settings.mode or self.global_mode or "ask"
        return mode

    def mode_source(self, state: SessionState) -> str:
        """Where :meth:`mode_for`'s answer comes from: ``session`` (set for it), ``profile``,
        ``global`` (the user's default, followed as it changes) or ``default``."""
        if state.mode:
            return "session"
        if self.settings.mode:
            return "profile"
        self.follow()
        return "global" if self.global_mode else "default"

    def evaluate(self, call: ToolCall, state: SessionState) -> Decision:
        self.follow()
        mode = self._mode(state)
        if call.delegate is not None:  # never wider than its owner's session
            mode = call.delegate.mode(mode)
        if self._broken is not None:
            reason = f"the policy cannot be read, so every call is refused until it can: {self._broken}"
            decision = Decision("deny", reason, "policy.unreadable", call.name, None, False, call.name, "execute", mode)
        else:
            decision = self._with_session(call, state, self._asked_tools(self._decide(call, state, mode)))
        return replace(decision, operating_mode=self.settings.operating_mode)

    # -- per risk class -----------------------------------------------------------------------

    def _decide(self, call: ToolCall, state: SessionState, mode: PermissionMode) -> Decision:
        base = Decision("deny", "", "", call.name, None, False, call.name, "execute", mode)
        if state.session_id != call.session_id:
            return replace(base, reason="this call belongs to another session", rule_id="session.mismatch")
        try:
            spec = self.tools(call.name)
        except ToolDenied as exc:
            return replace(base, reason=exc.message, rule_id="capability.unknown-tool")
        if not isinstance(call.params, spec.params):
            return replace(base, reason=f"{call.name} arguments were not validated", rule_id="capability.params")
        contract = self._contract(spec, base)
        if contract is not None:
            return contract
        if call.delegate is not None:
            refused = self._delegate(spec, call.delegate, base)
            if refused is not None:
                return refused
        if spec.name == "Bash":
            return self._bash(call, mode)
        if spec.plugin:
            fetch = self._web_fetch(call) if spec.plugin_risk != "high" else None
            if fetch is not None:
                return replace(base, level="allow", resource=call.name, reason=fetch.reason, rule_id=fetch.rule_id)
            return self._plugin(spec.plugin_risk, replace(base, resource=call.name), mode)
        if spec.risk == "execute":
            return self._by_mode(replace(base, resource=call.name), mode, "mode.execute", f"{call.name} runs code")
        return self._file(spec, call, mode)

    def _contract(self, spec: ToolSpec, base: Decision) -> Decision | None:
        """Seed 003 §10: plan and goal hard-deny Write, Edit and every plugin tool before any prompt,
        whatever the permission mode, a grant or a rule says."""
        operating = self.settings.operating_mode
        if operating not in CONTRACT_MODES:
            return None
        if spec.plugin:
            return replace(
                base,
                reason=f"{spec.name} is a plugin tool; no plugin tool runs in {operating} mode",
                rule_id="mode.plugin-disabled",
                decided_by="mode",
                error_code="PLUGIN_DISABLED_IN_PLAN",
            )
        if spec.risk == "write":
            return replace(
                base,
                reason=f"{spec.name} is not available in {operating} mode",
                rule_id=f"mode.{operating}",
                operation="write",
                decided_by="mode",
            )
        return None

    def _delegate(self, spec: ToolSpec, delegate: ResolvedDelegate, base: Decision) -> Decision | None:
        """Seed 003 §10.2: a delegate calls only its definition's tools, and only in agent mode."""
        operating = self.settings.operating_mode
        if operating in CONTRACT_MODES:
            return replace(
                base,
                reason=f"delegate {delegate.name}: delegates run in agent mode only, not in {operating} mode",
                rule_id="delegate.mode",
                decided_by="mode",
            )
        if spec.plugin or not delegate.allows(spec.name):
            return replace(
                base,
                reason=f"delegate {delegate.name} may not call {spec.name}; its tools: {delegate.listing()}",
                rule_id="delegate.tool",
            )
        return None

    def _plugin(self, risk: PluginRisk | None, base: Decision, mode: PermissionMode) -> Decision:
        """Seed 003 §6 and §11, agent mode: a plugin tool's registered risk decides (missing: medium)."""
        if risk == "low":
            return replace(base, level="allow", reason=f"{base.tool} is a low-risk plugin tool", rule_id="plugin.low")
        if risk == "high":
            return self._by_mode(base, mode, "plugin.high", f"{base.tool} is a high-risk plugin tool")
        if self.settings.medium_risk == "allow":
            reason = f"{base.tool} is a medium-risk plugin tool; the policy allows medium risk (medium_risk = allow)"
            return replace(base, level="allow", reason=reason, rule_id="plugin.medium")
        reason = f"{base.tool} is a medium-risk plugin tool (network or metadata); the policy confirms medium risk"
        return self._open(base, "plugin.medium", reason) or replace(
            base, level="confirm", reason=reason, rule_id="plugin.medium"
        )

    def _web_fetch(self, call: ToolCall) -> Finding | None:
        """Seed 004's readOnlyWebFetch and trusted.domains, for a fetch tool once the classifier is on."""
        if self.classifier_mode() == "off":
            return None
        args = call.params.model_dump(mode="json")
        exempt, domains = self.settings.exemptions.read_only_web_fetch, self.settings.trusted.domains
        return exemptions.public_fetch(call.name, args, domains, exempt)

    def _asked_tools(self, decision: Decision) -> Decision:
        """Seed 004's askTools: a tool the policy names is always asked, never granted for the session,
        whatever the mode (a denial stays a denial)."""
        if decision.level == "deny" or decision.tool not in self.settings.ask_tools:
            return decision
        if decision.level == "confirm":
            return replace(
                decision, grantable=False, classify=False, reason=f"{decision.reason} ({decision.tool} is always asked)"
            )
        return replace(
            decision,
            level="confirm",
            grantable=False,
            classify=False,
            rule_id="policy.ask-tools",
            decided_by="rule",
            reason=f"the policy's ask_tools names {decision.tool}: it is always asked ({decision.reason})",
        )

    def _file(self, spec: ToolSpec, call: ToolCall, mode: PermissionMode) -> Decision:
        target = self.target(spec, call.params)
        operation: Operation = "write" if spec.risk == "write" else "read"
        base = Decision(
            "allow",
            "",
            "",
            target.canonical,
            target.root,
            target.external,
            call.name,
            operation,
            mode,
            escape=target.escape,
            target=target,
        )
        protected = self.paths.protection(target, operation)
        if protected is not None and protected.layer == "deny":
            return replace(base, level="deny", reason=protected.reason, rule_id=protected.rule_id)
        if operation == "write" and target.external:
            # Seed 003 §4a: never ask for what cannot succeed. Outside the session roots the jail's
            # filesystem is read-only or private to one call: such a write would be lost.
            return replace(
                base,
                level="deny",
                rule_id="path.external-write",
                reason=f"{target.canonical} is outside the workspace and the scratch directory; in this sandbox "
                f"such a write cannot persist. Write inside {self.paths.workspace} or {self.paths.scratch} instead.",
            )
        ruled = self._file_rule(spec, target, base)
        if ruled is not None:
            return ruled
        if protected is not None:
            return replace(base, level="confirm", reason=protected.reason, rule_id=protected.rule_id, grantable=False)
        if target.external:
            return self._external(base, mode)
        if operation == "read" or target.root == "scratch":
            reason = "reads inside the session roots" if operation == "read" else "writes the scratch directory"
            return replace(base, reason=reason, rule_id=f"risk.{operation}.{target.root}")
        if self.classifier_mode() != "off":
            trusted = exemptions.trusted_write(target.canonical, self.trusted)
            if trusted is not None:
                return replace(base, reason=f"{call.name} {trusted.reason}", rule_id=trusted.rule_id)
            if self.settings.exemptions.in_project_writes:
                reason = f"{call.name} writes inside the workspace (exemption in_project_writes)"
                return replace(base, reason=reason, rule_id="exempt.in-project-write")
            opened = self._open(base, "classifier.write", f"{call.name} changes {target.canonical}")
            assert opened is not None
            return opened
        if mode == "ask":
            return replace(
                base,
                level="confirm",
                reason=f"{call.name} changes {target.canonical}",
                rule_id="mode.ask",
                decided_by="mode",
            )
        return replace(
            base, reason=f"{mode} mode allows edits in the workspace", rule_id=f"mode.{mode}", decided_by="mode"
        )

    def _external(self, base: Decision, mode: PermissionMode) -> Decision:
        what = f"{base.resource} is outside the workspace and scratch roots ({base.escape} path)"
        opened = self._open(base, "path.external", what)
        if opened is not None:
            return opened
        if mode == "auto":
            return replace(
                base,
                reason=f"auto mode allows an explicit external path: {what}",
                rule_id="path.external",
                decided_by="mode",
            )
        return replace(base, level="confirm", reason=what, rule_id="path.external", decided_by="mode")

    def _file_rule(self, spec: ToolSpec, target: ResolvedPath, base: Decision) -> Decision | None:
        rule = first_rule(self._file_rules, spec.name, target)
        if rule is None:
            return None
        text = f"matches your {rule.rule.action} rule {rule.rule.id} ({rule.rule.path})"
        level = RULE_LEVEL[rule.rule.action]
        return replace(base, level=level, reason=text, rule_id=rule.rule.id, grantable=level != "confirm")

    def _bash(self, call: ToolCall, mode: PermissionMode) -> Decision:
        assert isinstance(call.params, BashParams)
        check, writes = None, None  # while the classifier is off, the mode decides as before
        if self.classifier_mode() != "off":
            check, writes = bash_exemptions(self.settings, self.trusted, self.paths.workspace)
        verdict = commands.judge(call.params.command, self.paths, self.rules, check, writes, self.programs)
        base = Decision(
            "allow",
            verdict.finding.reason,
            verdict.finding.rule_id,
            call.params.command,
            "workspace",
            verdict.external,
            call.name,
            "execute",
            mode,
        )
        return self._from_finding(base, verdict.finding, mode, verdict.findings)

    def _from_finding(
        self, base: Decision, finding: Finding, mode: PermissionMode, findings: tuple[Finding, ...] = ()
    ) -> Decision:
        if finding.layer == "deny":
            return replace(base, level="deny")
        classifier = self.classifier_mode()
        hints = tuple(dict.fromkeys(f.reason for f in findings if f.rule_id in HINT_RULES))
        if finding.layer == "ask":
            asks = [f for f in findings if f.layer == "ask"]
            if classifier == "auto" and all(f.rule_id in HINT_RULES for f in asks):
                opened = self._open(base, finding.rule_id, finding.reason, hints)
                assert opened is not None
                return opened
            return replace(base, level="confirm", grantable=False)
        if finding.layer == "exempt":
            if classifier != "off" and finding.rule_id == "exempt.read-only" and not self._read_only_exempt():
                return self._by_mode(base, mode, "classifier.read-only", "read-only command (exemption off)")
            return base
        return self._by_mode(base, mode, finding.rule_id, finding.reason, hints)

    def _read_only_exempt(self) -> bool:
        return bool(self.settings.exemptions.read_only_commands)

    def _open(self, base: Decision, rule_id: str, reason: str, hints: tuple[str, ...] = ()) -> Decision | None:
        """A call the deterministic layers leave open, once the classifier is on: ``rules`` runs it,
        ``auto`` hands it to the model (confirm until judged: nobody judging means asking). Off: None."""
        classifier = self.classifier_mode()
        if classifier == "rules":
            reason = f"rules mode: no rule decides this call, so it runs ({reason})"
            return replace(base, level="allow", reason=reason, rule_id=rule_id, decided_by="mode")
        if classifier == "auto":
            return replace(
                base,
                level="confirm",
                reason=reason,
                rule_id=rule_id,
                decided_by="classifier",
                classify=True,
                hints=hints,
                grantable=True,
                kind=grant_kind(base.tool, base.resource, targeted=base.target is not None),
            )
        return None

    def _by_mode(
        self, base: Decision, mode: PermissionMode, rule_id: str, reason: str, hints: tuple[str, ...] = ()
    ) -> Decision:
        opened = self._open(base, rule_id, reason, hints)
        if opened is not None:
            return opened
        if mode == "auto":
            return replace(base, level="allow", reason=f"auto mode: {reason}", rule_id=rule_id, decided_by="mode")
        return replace(base, level="confirm", reason=reason, rule_id=rule_id, decided_by="mode")

    # -- grants, turn denials, TOCTOU -------------------------------------------------------------

    @staticmethod
    def _with_session(call: ToolCall, state: SessionState, decision: Decision) -> Decision:
        if decision.level != "confirm":
            return decision
        refused_by = state.was_denied(call.turn_id, call.name, decision.resource)
        if refused_by is not None:
            return replace(
                decision,
                level="deny",
                decided_by="turn-denial",
                rule_id="turn.denied",
                reason=f"{EARLIER_REFUSALS.get(refused_by, EARLIER_REFUSALS['error'])}; not asked again this turn",
            )
        if decision.grantable and state.has_grant(decision.kind or call.name):
            return replace(
                decision,
                level="allow",
                decided_by="grant",
                rule_id="grant.allow-session",
                reason=f"allowed for this session ({call.name}): {decision.reason}",
            )
        return decision

    def target(self, spec: ToolSpec, params: BaseModel) -> ResolvedPath:
        """The canonical path a file tool will touch (for Glob: the directory its pattern starts in)."""
        raw = getattr(params, spec.path_field, None) if spec.path_field else None
        if isinstance(params, GlobParams):
            raw = glob_base(params.pattern, raw)
        return self.paths.resolve(raw or ".")

    def recheck(self, decision: Decision, params: BaseModel) -> None:
        """After approval, just before running: the target must still be the approved one."""
        if decision.target is None:
            return
        now = self.target(self.tools(decision.tool), params)
        if now.canonical != decision.target.canonical or now.root != decision.target.root:
            raise ToolDenied(
                f"{decision.tool}: the target changed after approval ({decision.target.canonical} -> "
                f"{now.canonical}); nothing was done",
                rule_id="path.changed",
                approved=decision.target.canonical,
                now=now.canonical,
            )
