"""A session: one workspace, one scratch directory, one jail, one policy, one audit trail.

Every call passes the five boundaries in order (capability, parameters, policy, approval,
execution) and is audited whatever its outcome. Write and Edit are serialised per session;
reads, searches and Bash run side by side. Cancelling a call kills what it started.

    async with Sandbox.open(workspace, profile="default") as s:
        result = await s.call("Bash", {"command": "make test"}, on_stdout=print)

What a session is opened with, beyond its workspace, is one :class:`SessionOptions`: the keywords
``open`` and ``create`` take (``Sandbox.open(ws, mode="auto")``, or ``Sandbox.open(ws, **options)``).
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import os
import re
import shutil
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypedDict

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread
from pydantic import ValidationError

from sandbox import changes as kept_changes
from sandbox import datadir, leftovers, owners, review
from sandbox import plugins as plugin_tools
from sandbox import profile as profiles
from sandbox.audit import AuditLog, AuditRecord, args_digest, args_preview
from sandbox.backends import base
from sandbox.calls import check_workspace
from sandbox.errors import Aborted, Conflict, InvalidArgument, SandboxError, ToolDenied
from sandbox.policy import live_rules, shell
from sandbox.policy.approvals import (
    NO_ONE_ASKED,
    ApprovalRequest,
    ApprovalUnavailable,
    Approver,
    UnattendedApprover,
    decide,
)
from sandbox.policy.authorize import Authorization, authorize
from sandbox.policy.classifier import Callback as ClassifierCallback
from sandbox.policy.classifier import CallbackClassifier, ChatClassifier, Classifier
from sandbox.policy.delegates import Delegate
from sandbox.policy.gate import Gate, SessionState, ToolCall
from sandbox.policy.trust import TrustStore, ask_trust, ignored_notice
from sandbox.tools import params as tool_params
from sandbox.tools.base import Invocation
from sandbox.tools.builtin import TOOLS
from sandbox.tools.run import ToolResult, run_in_jail

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from pydantic import BaseModel
    from typing_extensions import Unpack

    from sandbox.exec import OutputCallback
    from sandbox.mounts import Changeset
    from sandbox.network.denial import Denial
    from sandbox.policy.delegates import ResolvedDelegate
    from sandbox.vocabulary import (
        Answer,
        BackendChoice,
        DecidedBy,
        MountStrategy,
        NetworkMode,
        Notice,
        OperatingMode,
        PermissionMode,
        ProjectTrust,
        Root,
    )

SCRATCH_MAX_AGE_S = 7 * 24 * 3600

MutationKind = Literal["edit", "patch"]
MUTATION_ATTEMPTS = 2  # the failed attempt in a turn that ends the repair loop (seed 003 §4d)
_TURNS_KEPT = 64  # turns whose failures are remembered when nobody ends them
_PATCH_TOOLS = frozenset({"patch", "apply_patch"})
_WRAPPERS = frozenset({"sudo", "doas", "env", "command", "exec", "time", "nice", "nohup"})
# Only for a command the shell parser cannot read (bashlex reads no quoted here-document, the usual
# form of apply_patch): its first line, before any here-document body.
_PATCH_LINE = re.compile(r"(?:^|[;&|(]|\bsudo)\s*(?:apply_patch|patch|git(?:\s+-[Cc]\s*\S+)*\s+apply)(?:\s|$)")


class _Withdrawn(BaseException):
    """The call was aborted while its question was open (a BaseException: ``decide`` must not turn
    it into a denial; ``Sandbox._authorize`` ends the call as ABORTED)."""


class _Withdrawable(Approver):
    """``approver``, its question withdrawn when ``abort`` is set before it is answered."""

    def __init__(self, approver: Approver, abort: anyio.Event) -> None:
        self.approver, self.abort = approver, abort
        self.who = approver.who

    async def ask(self, request: ApprovalRequest) -> Answer:
        outcome: list[Answer | Exception] = []
        async with anyio.create_task_group() as tg:

            async def withdraw_on_abort() -> None:
                await self.abort.wait()
                tg.cancel_scope.cancel()

            tg.start_soon(withdraw_on_abort)
            try:
                outcome.append(await self.approver.ask(request))
            except Exception as exc:  # decide() judges it, outside the task group (no exception group)
                outcome.append(exc)
            tg.cancel_scope.cancel()
        if not outcome:
            raise _Withdrawn
        if isinstance(outcome[0], Exception):
            raise outcome[0]
        return outcome[0]


def _recovered_notice(line: str) -> Notice:
    """What a session says of the work of a killed executor it kept as a changeset as it opened."""
    changeset = line.split()[0]
    return {
        "code": "changes.recovered",
        "message": f"the work of a sandbox that was killed was kept as changeset {line}: "
        f"review it with `sandbox changes show {changeset}`, apply it with `sandbox changes apply {changeset}`",
        "changeset_id": changeset,
    }


def sweep_scratch(keep: str | None = None, max_age_s: float = SCRATCH_MAX_AGE_S) -> list[str]:
    """Remove the scratch and review-changes directories of sessions that no longer exist: their
    executor is gone, or, unclaimed, they were untouched for ``max_age_s``. The sessions' ids."""
    swept = leftovers.sweep_sessions(keep=keep, max_age_s=max_age_s)
    return sorted({Path(path).name for path in (*swept.scratch, *swept.reviews)})


def is_patch_command(command: str) -> bool:
    """Whether a Bash command runs ``apply_patch``, ``git apply`` or ``patch``."""
    try:
        simples = shell.parse(command).commands
    except shell.Unparseable:
        return _PATCH_LINE.search(command.split("\n", 1)[0]) is not None
    return any(_runs_patch([word.text for word in simple.words]) for simple in simples)


def _runs_patch(words: list[str]) -> bool:
    index = 0  # past wrappers, their options and env's assignments
    while index < len(words) and (
        os.path.basename(words[index]) in _WRAPPERS or words[index].startswith("-") or "=" in words[index]
    ):
        index += 1
    if index == len(words):
        return False
    name, args = os.path.basename(words[index]), words[index + 1 :]
    if name in _PATCH_TOOLS:
        return True
    index = 0  # past git's global options: -C DIR, -c NAME=VALUE, --no-pager …
    while index < len(args) and args[index].startswith("-"):
        index += 2 if args[index] in ("-C", "-c") else 1
    return name == "git" and args[index : index + 1] == ["apply"]


class MutationGuard:
    """A session's failed mutations, counted per turn: Edits per path, shell patch commands together."""

    def __init__(self) -> None:
        self._turns: dict[str, Counter[tuple[MutationKind, str]]] = {}

    def failed(self, turn_id: str, kind: MutationKind, key: str) -> int:
        """Count one failure; the attempt it is (1 for the first of its kind and key in the turn)."""
        counts = self._turns.setdefault(turn_id, Counter())
        counts[kind, key] += 1
        if len(self._turns) > _TURNS_KEPT:  # a client that never ends its turns
            del self._turns[next(iter(self._turns))]
        return counts[kind, key]

    def end_turn(self, turn_id: str) -> None:
        self._turns.pop(turn_id, None)


class SessionOptions(TypedDict, total=False):
    """How to open a session; every key may be left out.

    ``profile`` is a shipped profile's name, a TOML path or a :class:`~sandbox.profile.Profile`
    (``default`` when absent); ``backend``, ``mount`` and ``operating_mode`` override its values,
    validated as the profile's own. ``mode`` is the session's permission mode (else the profile's,
    else the user's global one, else ``ask``); ``approver`` answers confirmations (else the
    profile's unattended answer); ``trust_project`` overrides the stored trust of the workspace
    for this session; ``session_id`` names the session (letters, digits and dashes). ``network``
    overrides the profile's mode; ``allow_hosts`` adds allowlist patterns (and implies
    ``allowlist``), as ``sandbox run --allow-host`` does; ``allow_indexes`` adds package indexes
    (``pypi``, ``npm=URL`` ...) as ``--allow-index`` does. ``plugins`` are plugin manifests
    (:mod:`sandbox.plugins`) whose directories the jail shows read-only; their tools are callable once
    registered (:meth:`Sandbox.register_plugin` asks the approver), or at once for the ids in
    ``granted_plugins`` (the user granted them up front). ``classifier`` judges the calls the
    rules leave open when ``policy.classifier`` is ``auto`` (seed 004): a
    :class:`~sandbox.policy.classifier.Classifier` or a function of a
    :class:`~sandbox.policy.classifier.ClassifyRequest` returning ``{"verdict", "reason"}``; absent,
    the profile's built-in client (``policy.classifier_endpoint``), else none (each such call is asked).
    """

    profile: str | profiles.Profile
    backend: BackendChoice | None
    mount: MountStrategy | None
    mode: PermissionMode | None
    operating_mode: OperatingMode | None
    network: NetworkMode | None
    allow_hosts: list[str] | None
    allow_indexes: list[str] | None
    approver: Approver | None
    session_id: str | None
    trust_project: bool | None
    plugins: list[str | Path] | None
    granted_plugins: list[str] | None
    classifier: Classifier | ClassifierCallback | None


class Sandbox:
    """Use ``Sandbox.open(...)``; the constructor only binds what ``open`` prepared."""

    def __init__(
        self,
        *,
        session_id: str,
        workspace: Path,
        scratch: Path,
        profile: profiles.Profile,
        jail: base.Jail,
        gate: Gate,
        approver: Approver,
        mode: PermissionMode | None,
    ) -> None:
        self.session_id = session_id
        self.workspace = workspace  # bound at open; never re-read from anything mutable
        self.scratch = scratch
        self.profile = profile
        self.jail = jail
        self.gate = gate
        self.approver = approver
        self.state = SessionState(session_id, mode)
        self.classifier: Classifier | None = None  # seed 004's model judgement (sandbox.policy.classifier)
        # This session's tools: the built-ins and its registered plugin tools (never another session's).
        self.plugins = plugin_tools.PluginHost()
        self.gate.tools = self.plugins.lookup
        self.audit = AuditLog()
        self.snapshots = review.SnapshotStore(session_id)
        self.mutations = MutationGuard()
        self._write_lock = anyio.Lock()
        self._closed = False
        self.kept: kept_changes.Kept | None = None  # what close kept of a copy/overlay session's changes
        self._commands: dict[str, str] = {}  # the Bash calls running now: tool_call_id -> turn_id
        self._in_flight = 0  # calls past their validation and not yet answered
        self.on_denial: Callable[[dict[str, Any]], None] | None = None  # told of each refused connection
        # What the session says once when it opens: ``{code, message[, file]}`` (``policy.project-ignored``:
        # the workspace's policy file was ignored because the project is not trusted).
        self.notices: list[Notice] = []

    @classmethod
    @contextlib.asynccontextmanager
    async def open(cls, workspace: str | Path, **options: Unpack[SessionOptions]) -> AsyncIterator[Sandbox]:
        sandbox = await cls.create(workspace, **options)
        try:
            yield sandbox
        finally:
            with anyio.CancelScope(shield=True):
                await sandbox.aclose()

    @classmethod
    async def create(cls, workspace: str | Path, **options: Unpack[SessionOptions]) -> Sandbox:
        """Open a session (the caller must ``aclose`` it); ``open`` is the context-managed form."""
        prof = _profile(options)
        ws = check_workspace(Path(workspace))
        sid = _session_id(options.get("session_id"))
        await anyio.to_thread.run_sync(sweep_scratch, sid)
        recovered = (await anyio.to_thread.run_sync(leftovers.sweep_dead_executors)).recovered
        # Created at open rather than at first use: a container's mounts are fixed when it starts.
        scratch = (datadir.subdir("scratch") / sid).resolve()
        async with contextlib.AsyncExitStack() as cleanup_on_fail:
            scratch.mkdir(mode=0o700, exist_ok=True)
            owners.claim(scratch)  # `sandbox gc` can tell a dead executor's scratch dir
            cleanup_on_fail.callback(owners.release, scratch)
            cleanup_on_fail.callback(shutil.rmtree, scratch, ignore_errors=True)
            # The policy is pure and may refuse (a bad rules file): decide it before a jail exists.
            # Rules saved while the session runs reach it at its next call (seed 004).
            approver = options.get("approver") or UnattendedApprover.from_settings(prof.policy)
            trusted = options.get("trust_project")
            if trusted is None and prof.policy.default_project_trust == "ask":  # seed 000 §10
                timeout = float(prof.policy.approval_timeout_s)
                trusted = await ask_trust(ws, approver, session_id=sid, timeout=timeout)
            live = live_rules(prof.policy, ws, trust_override=trusted)
            rules, global_mode = live.load()
            gate = Gate(
                ws, scratch, prof.policy, rules, global_mode=global_mode, live=live, programs=prof.env.workspace_path
            )
            notice = ignored_notice(ws, override=trusted, default=prof.policy.default_project_trust)
            # A bad manifest is refused before a jail exists, and so is one the project declares
            # outside the workspace without the project's trust and the user's grant.
            declared = _plugins(options, ws, _trusted(ws, trusted, prof.policy.default_project_trust))
            # Their directories, read-only in the jail: a jail option, never part of the profile.
            shared = plugin_tools.jail_binds(declared)
            jail = await base.choose(prof.backend, prof).open_jail(ws, prof, scratch=scratch, shared=shared)
            # e.g. the audit log cannot be opened (full disk): leave nothing running (aclose shields itself)
            cleanup_on_fail.push_async_callback(jail.aclose)
            sandbox = cls(
                session_id=sid,
                workspace=ws,
                scratch=scratch,
                profile=prof,
                jail=jail,
                gate=gate,
                approver=approver,
                mode=options.get("mode"),
            )
            sandbox.notices = [notice] if notice is not None else []
            sandbox.notices += [_recovered_notice(line) for line in recovered]
            sandbox.classifier = _classifier(options.get("classifier"), prof)
            sandbox.plugins = plugin_tools.PluginHost(declared)
            gate.tools = sandbox.plugins.lookup
            for plugin_id in options.get("granted_plugins") or []:
                sandbox._register(plugin_id, "turn-0", "plugin.granted", started=time.monotonic())
            sandbox._watch_egress()
            cleanup_on_fail.pop_all()
        return sandbox

    def configure(self, *, mode: PermissionMode | None = None, operating_mode: OperatingMode | None = None) -> None:
        """Change the permission mode or the operating mode of the running session (seed 003 §6).

        Only between calls (seed 003 §10.1: the host validates the active-turn boundary before any
        transition): with a call in flight it is CONFLICT and nothing changes. Plan and goal are
        entered from agent only (EnterPlanMode and EnterGoalMode exist in agent mode only): a direct
        plan <-> goal switch is INVALID_ARGUMENT; back to agent is always allowed.
        """
        if self._in_flight:
            raise Conflict(
                f"the session has {self._in_flight} call(s) in flight; change its mode between calls",
                session_id=self.session_id,
            )
        current = self.gate.settings.operating_mode
        if operating_mode not in (None, "agent", current) and current != "agent":
            raise InvalidArgument(
                f"the session is in {current} mode; {operating_mode} mode is entered from agent mode only "
                "(switch to agent first)",
                session_id=self.session_id,
                operating_mode=current,
            )
        if mode is not None:
            self.state.mode = mode
        if operating_mode is not None:
            self.gate.settings = self.gate.settings.model_copy(update={"operating_mode": operating_mode})

    # -- the network allowlist's proxy ------------------------------------------------------------

    def _watch_egress(self) -> None:
        """Hear the jail's proxy (on its own thread): each denial is audited and passed on, and with
        ``network.ask`` each unknown destination is put to this session's approver."""
        egress = self.jail.egress
        if egress is None:
            return
        token = anyio.lowlevel.current_token()
        egress.listeners.append(lambda denial: anyio.from_thread.run_sync(self._denied, denial, token=token))
        if self.profile.network.ask:
            egress.ask_with(lambda host, port: anyio.from_thread.run(self._ask_connect, host, port, token=token))

    def _denied(self, denial: Denial) -> None:
        """A connection the proxy refused: the audit row, and ``on_denial`` (the server's notification)."""
        call_id = self._running_command()[0]
        event = {"session_id": self.session_id, "tool_call_id": call_id, **dataclasses.asdict(denial)}
        with contextlib.suppress(SandboxError):  # an unwritable log must not hide the denial itself
            self.audit.record_denial(self.session_id, call_id, event)
        if self.on_denial is not None:
            self.on_denial({**event, "line": denial.line()})

    def _running_command(self) -> tuple[str, str]:
        """The Bash call a connection belongs to when exactly one runs, else ``("", "")``."""
        return next(iter(self._commands.items())) if len(self._commands) == 1 else ("", "")

    async def _ask_connect(self, host: str, port: int) -> Answer:
        call_id, turn_id = self._running_command()
        request = ApprovalRequest.for_connection(self.session_id, host, port, turn_id=turn_id, tool_call_id=call_id)
        outcome = await decide(self.approver, request, float(self.profile.policy.approval_timeout_s))
        # Who refused, told apart (the proxy's ask-timeout and ask-unavailable): only a user says no.
        if outcome.decided_by == "timeout":
            raise TimeoutError(outcome.reason)
        if not outcome.allowed and outcome.decided_by != "user":
            raise ApprovalUnavailable(outcome.reason)
        return outcome.answer

    # -- the five boundaries ----------------------------------------------------------------------

    async def call(
        self,
        name: str,
        args: dict[str, Any],
        *,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
        tool_call_id: str | None = None,
        turn_id: str = "turn-0",
        abort: anyio.Event | None = None,
        delegate: Delegate | dict[str, Any] | None = None,
        user_message: str | None = None,
    ) -> ToolResult:
        """``delegate`` names the delegate making the call (seed 003 §10.2): its tools and its
        permission bound the call, never wider than this session; its warnings (a dropped tool or
        permission) come back in ``details["delegate_warnings"]``."""
        started = time.monotonic()
        call_id = tool_call_id or uuid.uuid4().hex[:16]
        if self._closed:
            return ToolResult(ok=False, error_code="INVALID_ARGUMENT", content="the session is closed")
        try:
            resolved = _delegate(delegate)
            tools = self.plugins.tools  # this session's registry: the built-ins and its plugin tools
            spec = tool_params.lookup(name, tools)  # 1 capability
            params = tool_params.validate(name, args, max_timeout_s=self.profile.timeouts.max_s, tools=tools)  # 2
        except SandboxError as exc:
            self._audit_rejected(name, args, call_id, turn_id, exc, started)
            return _error(exc)
        call = ToolCall(self.session_id, turn_id, call_id, name, params, resolved, user_message=user_message)
        self._in_flight += 1
        try:
            result = await self._authorized(call, spec, started, on_stdout, on_stderr, abort)
        except anyio.get_cancelled_exc_class():
            # The client cancelled the request itself (MCP's notifications/cancelled): the call's
            # tree is killed by the cancellation; the audit still says how it ended.
            self._audit_ended(call, Aborted("the client cancelled the call"), started, "cancelled")
            raise
        finally:
            self._in_flight -= 1
        if resolved is not None and resolved.warnings:
            result.details["delegate_warnings"] = list(resolved.warnings)
        return result

    async def _authorized(
        self,
        call: ToolCall,
        spec: tool_params.ToolSpec,
        started: float,
        on_stdout: OutputCallback | None,
        on_stderr: OutputCallback | None,
        abort: anyio.Event | None,
    ) -> ToolResult:
        """Boundaries 3 to 5 of a call whose tool and arguments passed 1 and 2."""
        params = call.params
        auth = await self._authorize(call, abort)  # 3, 4
        if auth is None:
            exc = Aborted("the call was cancelled while it waited for approval: nothing ran", tool=call.name)
            self._audit_ended(call, exc, started, "cancelled")
            return _error(exc)
        ran_at = time.monotonic()
        try:
            auth.raise_if_denied()
            self.gate.recheck(auth.decision, params)  # TOCTOU: the target must still be the approved one
            if spec.risk == "write":
                async with self._write_lock:
                    result = await self._execute(call, auth, on_stdout, on_stderr, abort)
            else:
                result = await self._execute(call, auth, on_stdout, on_stderr, abort)  # 5 execute
        except SandboxError as exc:
            result = _error(exc, root=auth.decision.root)
        self._guard_mutation(call, auth, result)
        try:
            self._audit(call, auth, result, started, ran_at)
        except SandboxError as exc:
            # The call already happened: lose neither its result nor the fact that it went unrecorded.
            result.details["audit_error"] = exc.to_dict()
        return result

    async def _authorize(self, call: ToolCall, abort: anyio.Event | None) -> Authorization | None:
        """The gate's and, when it asks, the approver's word; ``None`` when the call is aborted
        first (``tool.cancel``, pi's abort): a pending question is then withdrawn at once, not
        left to be answered. Only a call that asks pays for watching the abort."""
        if abort is not None and abort.is_set():
            return None
        approver = self.approver if abort is None else _Withdrawable(self.approver, abort)
        try:
            return await authorize(self.gate, self.state, call, approver, classifier=self.classifier)
        except _Withdrawn:
            return None

    async def _execute(
        self,
        call: ToolCall,
        auth: Authorization,
        on_stdout: OutputCallback | None,
        on_stderr: OutputCallback | None,
        abort: anyio.Event | None,
    ) -> ToolResult:
        params = call.params
        plugin_tool = self.plugins.tool(call.name)
        if plugin_tool is not None and isinstance(params, plugin_tools.PluginArgs):
            return await plugin_tools.run(
                self.jail, plugin_tool, params, env=self.scratch_env(), cwd=str(self.workspace), abort=abort
            )
        tool = TOOLS[call.name]
        target = self._runner_target(params, auth) if tool.needs_target else None
        invocation = Invocation(
            params, target, auth.decision.root, call.tool_call_id, call.turn_id, on_stdout, on_stderr, abort
        )
        if not tool.runs_commands:
            return await tool.run(self, invocation)
        self._commands[call.tool_call_id] = call.turn_id  # its network denials are this call's
        try:
            return await tool.run(self, invocation)
        finally:
            self._commands.pop(call.tool_call_id, None)

    def scratch_env(self) -> dict[str, str]:
        """What Bash and plugin commands get beyond the scrubbed environment: the scratch directory."""
        return {"SANDBOX_SCRATCH_DIR": str(self.scratch), "PI_SCRATCH_DIR": str(self.scratch)}

    # -- plugin tools (seed 003 §11) and the client's own tools -----------------------------------

    async def register_plugin(
        self, plugin_id: str, *, turn_id: str = "turn-0", tool_call_id: str | None = None
    ) -> dict[str, Any]:
        """Register a declared plugin's tools after the user's grant (seed 003 §11).

        The approver is asked (operation ``register``, the tools and their risks as the resource);
        only a user's allow registers them. No one to ask (an unattended session), a timeout, a
        closed channel or a denial: not registered. Audited either way. Returns the plugin's
        listing (:meth:`plugin_tools.Plugin.describe`) with ``registered`` and ``reason``.
        """
        started = time.monotonic()
        plugin = self.plugins.plugin(plugin_id)
        if plugin_id in self.plugins.registered:
            return {**plugin.describe(True), "reason": "already registered in this session"}
        call_id = tool_call_id or f"register-{uuid.uuid4().hex[:12]}"
        resource, reason = plugin_tools.registration_text(plugin)
        if self.approver.who != "user":
            why = (
                f"{NO_ONE_ASKED}: no one attends this session to grant plugin {plugin_id} "
                "(grant it up front: sandbox serve --grant-plugin, or granted_plugins)"
            )
            self._audit_registration(plugin, call_id, turn_id, started, allowed=False, rule_id="plugin.unattended")
            return {**plugin.describe(False), "reason": why, "decided_by": "unattended"}
        request = ApprovalRequest(
            session_id=self.session_id,
            turn_id=turn_id,
            tool_call_id=call_id,
            tool=f"plugin.{plugin.id}",
            operation="register",
            resource=resource,
            reason=reason,
            rule_id="plugin.register",
            allow_session=False,
        )
        outcome = await decide(self.approver, request, float(self.profile.policy.approval_timeout_s))
        allowed = outcome.allowed and outcome.decided_by == "user"
        if allowed:
            self.plugins.register(plugin_id)
        self._audit_registration(
            plugin,
            call_id,
            turn_id,
            started,
            allowed=allowed,
            rule_id="plugin.register",
            decided_by=outcome.decided_by,
            answer=outcome.answer,
            wait_ms=outcome.wait_ms,
        )
        return {**plugin.describe(allowed), "reason": outcome.reason, "decided_by": outcome.decided_by}

    def _register(self, plugin_id: str, turn_id: str, rule_id: str, *, started: float) -> None:
        """Register without asking: the user granted the plugin up front (a flag, an option)."""
        plugin = self.plugins.register(plugin_id)
        self._audit_registration(plugin, f"register-{uuid.uuid4().hex[:12]}", turn_id, started, True, rule_id)

    def _audit_registration(
        self,
        plugin: plugin_tools.Plugin,
        call_id: str,
        turn_id: str,
        started: float,
        allowed: bool,
        rule_id: str,
        decided_by: DecidedBy = "rule",
        answer: Answer | None = None,
        wait_ms: float = 0.0,
    ) -> None:
        data = {"plugin": plugin.id, "manifest": str(plugin.path), "tools": sorted(plugin.tools)}
        total = round((time.monotonic() - started) * 1000, 3)
        prompted = decided_by in ("user", "timeout", "cancelled", "invalid")
        self.audit.record(
            AuditRecord(
                self.session_id,
                turn_id,
                call_id,
                f"plugin.{plugin.id}",
                args_digest(data),
                args_preview(data),
                plugin_tools.registration_text(plugin)[0],
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

    def tools_listing(self) -> list[dict[str, Any]]:
        """The tools the model may call in this session now: the built-ins and, in agent mode, the
        registered plugin tools (plan and goal hide them, seed 003 §10), each with its JSON Schema."""
        listed = [
            {"name": spec.name, "description": spec.description, "parameters": plugin_tools.schema_of(spec)}
            for spec in tool_params.REGISTRY.values()
        ]
        if self.gate.settings.operating_mode == "agent":
            listed += self.plugins.registered_tools()
        return listed

    async def check_tool(
        self,
        name: str,
        args: dict[str, Any] | None = None,
        *,
        tool_call_id: str | None = None,
        turn_id: str = "turn-0",
        user_message: str | None = None,
    ) -> ToolResult:
        """Boundaries 3 and 4 for a tool the client runs itself (another pi extension's): decided as a
        medium-risk plugin tool (denied in plan and goal, asked unless the policy allows medium risk;
        the policy's ``ask_tools`` always asks), asked, audited. ``ok``: the client may run it. Nothing
        runs here: such a tool runs in the client's process, not in the jail."""
        started = time.monotonic()
        call_id = tool_call_id or uuid.uuid4().hex[:16]
        if self._closed:
            return ToolResult(ok=False, error_code="INVALID_ARGUMENT", content="the session is closed")
        try:
            spec = self.plugins.external(name)
            params = spec.params.model_validate(dict(args or {}))
        except SandboxError as exc:
            self._audit_rejected(name, args or {}, call_id, turn_id, exc, started)
            return _error(exc)
        except ValidationError as exc:
            error = InvalidArgument(f"{name}: arguments must be a JSON object ({exc.error_count()} problems)")
            self._audit_rejected(name, args or {}, call_id, turn_id, error, started)
            return _error(error)
        call = ToolCall(self.session_id, turn_id, call_id, name, params, user_message=user_message)
        self._in_flight += 1
        try:
            auth = await authorize(self.gate, self.state, call, self.approver, classifier=self.classifier)
            ran_at = time.monotonic()
            try:
                auth.raise_if_denied()
                result = ToolResult(ok=True, content=f"{name} may run: {auth.reason}", details={"checked": True})
            except SandboxError as exc:
                result = _error(exc)
            result.details.update(decided_by=auth.decided_by, rule_id=auth.decision.rule_id)
            self._audit(call, auth, result, started, ran_at)
        finally:
            self._in_flight -= 1
        return result

    def _guard_mutation(self, call: ToolCall, auth: Authorization, result: ToolResult) -> None:
        """Seed 003 §4d: the second failed Edit of a path in a turn, or the second failed shell patch
        command, ends the repair loop: the result says so and carries ``terminate``."""
        failure = _mutation_failure(call, auth, result)
        if failure is None:
            return
        attempt = self.mutations.failed(call.turn_id, *failure)
        terminate = attempt >= MUTATION_ATTEMPTS
        result.details.update(mutationFailureKind=failure[0], mutationFailureAttempt=attempt, terminate=terminate)
        result.content += "\n" + _mutation_note(*failure, attempt)

    def _runner_target(self, params: BaseModel, auth: Authorization) -> str:
        if isinstance(params, tool_params.GlobParams):
            return self.gate.paths.resolve(params.path or ".").canonical
        assert auth.decision.target is not None
        return auth.decision.target.canonical

    def readable(self, path: str) -> bool:
        """Whether the policy lets the model read ``path`` (a tool shows only what it may)."""
        return self.gate.paths.readable(path)

    # -- rollback, audit, close -------------------------------------------------------------------

    async def rollback(self, snapshot_id: str) -> ToolResult:
        snap, before = self.snapshots.load(snapshot_id)
        if snap.state == "rolledBack":
            return ToolResult(
                ok=True,
                content=f"{snap.path} was already rolled back",
                root="workspace",
                details={"snapshot_id": snapshot_id, "path": snap.path},
            )
        if not snap.reversible:
            raise Conflict(
                f"{snap.path}: the previous content was too large to keep; rollback is unavailable",
                snapshot_id=snapshot_id,
            )
        request = {
            "op": "restore",
            "path": snap.path,
            "expect_sha256": snap.after_sha256,
            "before": base64.b64encode(before).decode() if snap.existed and before is not None else None,
        }
        async with self._write_lock:
            reply = await run_in_jail(self.jail, request)
        if not reply["ok"]:
            raise Conflict(reply["content"], snapshot_id=snapshot_id, path=snap.path)
        self.snapshots.mark(snap, "rolledBack")
        return ToolResult(
            ok=True,
            content=reply["content"],
            root="workspace",
            details={"snapshot_id": snapshot_id, "path": snap.path},
        )

    def _audit(self, call: ToolCall, auth: Authorization, result: ToolResult, started: float, ran_at: float) -> None:
        now = time.monotonic()
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
        self.audit.record(record)

    def _audit_ended(self, call: ToolCall, exc: SandboxError, started: float, decided_by: DecidedBy) -> None:
        """A call that ended before it ran (cancelled while asked, or its request cancelled)."""
        with contextlib.suppress(SandboxError):
            self._audit_rejected(
                call.name,
                call.params.model_dump(),
                call.tool_call_id,
                call.turn_id,
                exc,
                started,
                decided_by=decided_by,
            )

    def _audit_rejected(
        self,
        name: str,
        args: Any,
        call_id: str,
        turn_id: str,
        exc: SandboxError,
        started: float,
        *,
        decided_by: DecidedBy = "rule",
    ) -> None:
        data = args if isinstance(args, dict) else {"args": repr(args)}
        total = round((time.monotonic() - started) * 1000, 3)
        rule = "capability.unknown-tool" if isinstance(exc, ToolDenied) else "capability.params"
        if isinstance(exc, Aborted):
            rule = "call.cancelled"
        self.audit.record(
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

    def end_turn(self, turn_id: str) -> None:
        self.state.end_turn(turn_id)
        self.mutations.end_turn(turn_id)

    # -- the private tree of a copy/overlay session -----------------------------------------------

    @property
    def changeset_id(self) -> str | None:
        """The id close kept this session's changes under; None before close or with nothing kept."""
        return self.kept.id if self.kept is not None else None

    async def changes(self) -> Changeset:
        """What the session changed so far in its private tree; INVALID_ARGUMENT for rw and ro."""
        if self.jail.tree is None:
            mount = self.jail.mount
            how = "writes in place" if mount == "rw" else "cannot write"
            raise InvalidArgument(f"mount {mount} {how}; there is nothing to review", mount=mount)
        async with self._write_lock:  # not half-way through a Write
            changeset = await self.jail.changes()
        assert changeset is not None  # a jail with a tree always has a changeset
        return changeset

    async def keep_changes(self) -> kept_changes.Kept | None:
        """Keep the private tree's changes under an id (once); None when there is no tree or no change."""
        if self.jail.tree is None or self.kept is not None:
            return self.kept
        changeset = await self.jail.changes()
        if changeset is None or not changeset.changes:
            return None
        self.kept = await kept_changes.keep(
            self.jail.tree,
            changeset,
            source="session",
            profile=self.profile.name,
            backend=self.jail.backend,
            limit=self.profile.limits.kept_changes,
            environment=self.profile.mount.environment,
        )
        return self.kept

    async def aclose(self) -> None:
        """Close the jail, keeping a copy/overlay session's changes first (never discarding them)."""
        if self._closed:
            return
        self._closed = True
        try:
            async with self._write_lock:
                await self.keep_changes()  # before the jail's close removes the private tree
        finally:
            await self._release()

    async def _release(self) -> None:
        try:
            await self.jail.aclose()
        finally:
            shutil.rmtree(self.scratch, ignore_errors=True)
            owners.release(self.scratch)
            self.snapshots.remove_all()
            self.audit.close()


def _mutation_failure(call: ToolCall, auth: Authorization, result: ToolResult) -> tuple[MutationKind, str] | None:
    """What a failed call counts against: an Edit its path, a patch command all of them; else None.

    Only a tool that ran and failed counts: a refusal, a timeout or an abort is no failed edit."""
    if result.ok or not auth.allowed or result.error_code != "TOOL_FAILED":
        return None
    if call.name == "Edit" and auth.decision.target is not None:
        return "edit", auth.decision.target.canonical
    if isinstance(call.params, tool_params.BashParams) and is_patch_command(call.params.command):
        return "patch", ""
    return None


def _mutation_note(kind: MutationKind, path: str, attempt: int) -> str:
    what, target = (f"Edit of {path}", "the file") if kind == "edit" else ("patch command", "the target files")
    if attempt < MUTATION_ATTEMPTS:
        return (
            f"[a failed {what}: Read {target} once more and regenerate the change; "
            "a second failure in this turn stops the attempt]"
        )
    what = "a patch command (apply_patch, git apply or patch)" if kind == "patch" else f"the {what}"
    return (
        f"[stop: {what} failed again in this turn (failure {attempt}). Do not retry it, nor hand-edit the change: "
        f"Read {target} again before any other change, or stop and ask the user, saying exactly what did not match]"
    )


def _delegate(given: Delegate | dict[str, Any] | None) -> ResolvedDelegate | None:
    if given is None:
        return None
    try:
        return (given if isinstance(given, Delegate) else Delegate.model_validate(given)).resolve()
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'delegate'}: {e['msg']}" for e in exc.errors())
        raise InvalidArgument(f"invalid delegate: {problems}") from exc


def _trusted(workspace: Path, override: bool | None, default: ProjectTrust) -> bool:
    """Whether the project is trusted for this session (an override, a stored decision, the default)."""
    return TrustStore().decision(workspace, override, default == "always").trusted


def _plugins(options: SessionOptions, workspace: Path, trusted: bool) -> list[plugin_tools.Plugin]:
    """The options' plugin manifests, loaded; a granted id must name one of them; what the project
    declares is checked (:func:`plugin_tools.check_declared`)."""
    declared = plugin_tools.load_all(options.get("plugins") or [])
    ids = {p.id for p in declared}
    granted = options.get("granted_plugins") or []
    for plugin_id in granted:
        if plugin_id not in ids:
            raise InvalidArgument(f"granted plugin {plugin_id!r} was not declared", plugin=plugin_id)
    plugin_tools.check_declared(declared, workspace, trusted=trusted, granted=granted)
    return declared


def _error(exc: SandboxError, root: Root | None = None) -> ToolResult:
    return ToolResult(ok=False, error_code=exc.code, content=exc.message, details=exc.data, root=root)


def _profile(options: SessionOptions) -> profiles.Profile:
    """The options' profile with their overrides, validated as the profile's own values."""
    unknown = sorted(set(options) - SessionOptions.__optional_keys__)
    if unknown:  # what Python says of a keyword no signature names
        raise TypeError(f"Sandbox.open() got an unexpected keyword argument {unknown[0]!r}")
    named = options.get("profile", "default")
    profile = named if isinstance(named, profiles.Profile) else profiles.load(named)
    hosts, index_specs = options.get("allow_hosts") or [], options.get("allow_indexes") or []
    network = options.get("network")
    asked = "allow_indexes" if index_specs else "allow_hosts" if hosts else None
    if asked and network not in (None, "allowlist"):
        raise InvalidArgument(f"{asked} needs the allowlist network, not {network!r}", network=network)
    overrides = {
        "backend": options.get("backend"),
        "mount.strategy": options.get("mount"),
        "policy.operating_mode": options.get("operating_mode"),
        "network.mode": "allowlist" if asked else network,
        "network.allow": [*profile.network.allow, *hosts] if hosts else None,
        "network.indexes": [*profile.network.indexes, *index_specs] if index_specs else None,
    }
    labels = {"network.indexes": "allow_indexes"}  # a refusal names the option, not the profile's file
    if asked and network is None:
        labels["network.mode"] = asked
    return profile.override(overrides, labels)


def _classifier(given: Classifier | ClassifierCallback | None, prof: profiles.Profile) -> Classifier | None:
    if isinstance(given, Classifier):
        return given
    if given is not None:
        return CallbackClassifier(given)
    return ChatClassifier.from_settings(prof.policy)


def _session_id(given: str | None) -> str:
    sid = given or uuid.uuid4().hex[:16]
    if not sid.replace("-", "").isalnum():
        raise InvalidArgument(f"session id {sid!r} must be letters, digits and dashes", session_id=sid)
    return sid
