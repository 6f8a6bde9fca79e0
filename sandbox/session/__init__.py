"""A session: one workspace, one scratch directory, one jail, one policy, one audit trail.

Every call passes the five boundaries in order (capability, parameters, policy, approval,
execution) and is audited whatever its outcome. Write and Edit are serialised per session;
reads, searches and Bash run side by side. Cancelling a call kills what it started.

    async with Sandbox.open(workspace, profile="default") as s:
        result = await s.call("Bash", {"command": "make test"}, on_stdout=print)

What a session is opened with, beyond its workspace, is one :class:`SessionOptions`: the keywords
``open`` and ``create`` take (``Sandbox.open(ws, mode="auto")``, or ``Sandbox.open(ws, **options)``).

Here the session binds its parts and runs the flow; what it leans on is apart, one idea a module:
:mod:`~sandbox.session.opening` (the options and what they settle before a jail exists),
:mod:`~sandbox.session.withdrawal` (a question withdrawn when its call is aborted),
:mod:`~sandbox.session.repair` (the end of a repair loop), :mod:`~sandbox.session.records` (the
audit rows), :mod:`~sandbox.session.network` (what the jail's proxy refuses or asks),
:mod:`~sandbox.session.grants` (a plugin's registration) and :mod:`~sandbox.session.rollback`.
"""

from __future__ import annotations

import contextlib
import shutil
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread
from pydantic import ValidationError

from sandbox import changes as kept_changes
from sandbox import datadir, leftovers, owners, review, shells
from sandbox import plugins as plugin_tools
from sandbox.audit import AuditLog
from sandbox.backends import base
from sandbox.calls import check_workspace
from sandbox.errors import Aborted, Conflict, InvalidArgument, SandboxError
from sandbox.plugins import execution as plugin_execution
from sandbox.policy import live_rules
from sandbox.policy.approvals import Approver, UnattendedApprover
from sandbox.policy.delegates import Delegate
from sandbox.policy.gate import Gate, SessionState, ToolCall
from sandbox.policy.trust import TrustDecision, TrustStore, ignored_notice
from sandbox.session import external, forks, grants, mutations
from sandbox.session.network import NetworkWatch
from sandbox.session.opening import (
    FIXED_TRUST,
    SessionOptions,
    classifier_for,
    declared_plugins,
    profile_for,
    project_trust,
    project_trusted,
    recovered_notice,
    session_id_for,
)
from sandbox.session.records import Recorder
from sandbox.session.repair import MutationGuard
from sandbox.session.rollback import roll_back
from sandbox.session.withdrawal import authorize_unless_aborted
from sandbox.tools import params as tool_params
from sandbox.tools.base import Invocation
from sandbox.tools.builtin import TOOLS
from sandbox.tools.run import ToolResult

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Mapping

    from pydantic import BaseModel
    from typing_extensions import Unpack

    from sandbox import profile as profiles
    from sandbox.exec import OutputCallback
    from sandbox.mounts import Changeset
    from sandbox.policy.authorize import Authorization
    from sandbox.policy.classifier import Classifier
    from sandbox.policy.delegates import ResolvedDelegate
    from sandbox.vocabulary import Notice, OperatingMode, PermissionMode, Root

# SessionOptions is named here, the package's face, as well as in sandbox.session.opening, its home.
__all__ = ["SCRATCH_MAX_AGE_S", "Sandbox", "SessionOptions", "sweep_scratch"]

SCRATCH_MAX_AGE_S = 7 * 24 * 3600


def sweep_scratch(keep: str | None = None, max_age_s: float = SCRATCH_MAX_AGE_S) -> list[str]:
    """Remove the scratch and review-changes directories of sessions that no longer exist: their
    executor is gone, or, unclaimed, they were untouched for ``max_age_s``. The sessions' ids."""
    swept = leftovers.sweep_sessions(keep=keep, max_age_s=max_age_s)
    return sorted({Path(path).name for path in (*swept.scratch, *swept.reviews)})


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
        self.records = Recorder(self.audit, session_id, gate, self.state)
        self.snapshots = review.SnapshotStore(session_id)
        self.mutations = MutationGuard()
        self.write_lock = anyio.Lock()
        self.closed = False
        self.kept: kept_changes.Kept | None = None  # what close kept of a copy/overlay session's changes
        self.in_flight = 0  # calls past their validation and not yet answered
        self.network = NetworkWatch(session_id, self.audit)  # what the jail's proxy refuses or asks
        # What the session says once when it opens: ``{code, message[, file]}`` (``policy.project-ignored``:
        # the workspace's policy file was ignored because the project is not trusted).
        self.notices: list[Notice] = []
        self.trust_override: tuple[bool | None, str] = (None, "default")  # set as the session opens
        self.shells = shells.TurnShells()
        # Snapshots (sandbox.session.forks): the line it restores within, its last snapshot, what reopens it.
        self.lineage = session_id
        self.current_snapshot: str | None = None
        self.backend: base.Backend | None = None  # set by create
        self.shared: tuple[tuple[str, str], ...] = ()
        self.options: SessionOptions = {}

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
        prof = profile_for(options)
        ws = check_workspace(Path(workspace))
        sid = session_id_for(options.get("session_id"))
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
            decision = await project_trust(options, ws, prof, approver, sid)
            trusted = decision.trusted if decision.source in FIXED_TRUST else None
            live = live_rules(prof.policy, ws, trust_override=trusted)
            rules, global_mode = live.load()
            gate = Gate(
                ws, scratch, prof.policy, rules, global_mode=global_mode, live=live, programs=prof.env.workspace_path
            )
            notice = ignored_notice(ws, override=trusted, default=prof.policy.default_project_trust)
            # A bad manifest is refused before a jail exists, and so is one the project declares
            # outside the workspace without the project's trust and the user's grant.
            declared = declared_plugins(options, ws, project_trusted(ws, trusted, prof.policy.default_project_trust))
            # Their directories, read-only in the jail: a jail option, never part of the profile.
            shared = plugin_tools.jail_binds(declared)
            chosen = base.choose(prof.backend, prof)
            seed = await forks.seed_for(options.get("from_snapshot"), ws, chosen, prof)
            jail = await chosen.open_jail(ws, prof, scratch=scratch, shared=shared, seed=seed)
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
            sandbox.trust_override = trusted, decision.source
            sandbox.backend, sandbox.shared, sandbox.options = chosen, tuple(shared), options
            sandbox.notices = [notice] if notice is not None else []
            sandbox.notices += [recovered_notice(line) for line in recovered]
            sandbox.notices += sandbox.mode_notices()
            if (fallback := base.fallback_note(chosen, prof)) is not None:
                sandbox.notices.append({"code": "backend.fallback", "message": fallback})
            sandbox.classifier = classifier_for(options.get("classifier"), prof)
            sandbox.plugins = plugin_tools.PluginHost(declared)
            gate.tools = sandbox.plugins.lookup
            for plugin_id in options.get("granted_plugins") or []:
                grants.register_granted(
                    sandbox.plugins, plugin_id, sandbox.records, turn_id="turn-0", rule_id="plugin.granted"
                )
            sandbox.listen_to(jail)
            if seed is not None:
                await forks.started_from(sandbox, seed, options)
            cleanup_on_fail.pop_all()
        return sandbox

    def listen_to(self, jail: base.Jail) -> None:
        """Hear ``jail``'s proxy: its denials, and its questions when the profile asks (``network.ask``)."""
        ask = self.approver if self.profile.network.ask else None
        self.network.listen(jail.egress, ask, float(self.profile.policy.approval_timeout_s))

    def configure(
        self,
        *,
        mode: PermissionMode | Literal["inherit"] | None = None,
        operating_mode: OperatingMode | None = None,
        network: Mapping[str, Any] | None = None,
        secrets: Mapping[str, Any] | None = None,
    ) -> None:
        """Change the permission mode, the operating mode (seed 003 §6) or the network of the running session.

        ``network`` replaces the allowlist session's ``allow``, ``deny``, ``ask`` or ``requests`` it
        names, ``secrets`` its secrets (issue 36); the proxy follows from the next connection, and
        the change is audited.

        Only between calls (seed 003 §10.1: the host validates the active-turn boundary before any
        transition): with a call in flight it is CONFLICT and nothing changes. Plan and goal are
        entered from agent only (EnterPlanMode and EnterGoalMode exist in agent mode only): a direct
        plan <-> goal switch is INVALID_ARGUMENT; back to agent is always allowed.
        """
        if self.in_flight:
            raise Conflict(
                f"the session has {self.in_flight} call(s) in flight; change its mode between calls",
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
        if network is not None or secrets is not None:
            self.profile = self.network.change(self.profile, self.jail.egress, network, secrets)
        if mode is not None:  # "inherit": the session's own mode goes; the profile's or the global one applies
            self.state.mode = None if mode == "inherit" else mode
        if operating_mode is not None:
            self.gate.settings = self.gate.settings.model_copy(update={"operating_mode": operating_mode})

    @property
    def on_denial(self) -> Callable[[dict[str, Any]], None] | None:
        """Told of each connection the jail's proxy refused (the server's notification)."""
        return self.network.on_denial

    @on_denial.setter
    def on_denial(self, listener: Callable[[dict[str, Any]], None] | None) -> None:
        self.network.on_denial = listener

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
        if self.closed:
            return ToolResult(ok=False, error_code="INVALID_ARGUMENT", content="the session is closed")
        try:
            resolved = _delegate(delegate)
            tools = self.plugins.tools  # this session's registry: the built-ins and its plugin tools
            spec = tool_params.lookup(name, tools)  # 1 capability
            params = tool_params.validate(name, args, max_timeout_s=self.profile.timeouts.max_s, tools=tools)  # 2
        except SandboxError as exc:
            self.records.rejected(name, args, call_id, turn_id, exc, total=_ms_since(started))
            return _error(exc)
        call = ToolCall(self.session_id, turn_id, call_id, name, params, resolved, user_message=user_message)
        self.in_flight += 1
        try:
            result = await self._authorized(call, spec, started, on_stdout, on_stderr, abort)
        except anyio.get_cancelled_exc_class():
            # The client cancelled the request itself (MCP's notifications/cancelled): the call's
            # tree is killed by the cancellation; the audit still says how it ended.
            self.records.ended(
                call, Aborted("the client cancelled the call"), total=_ms_since(started), decided_by="cancelled"
            )
            raise
        finally:
            self.in_flight -= 1
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
        # 3, 4: the gate's and, when it asks, the approver's word
        auth = await authorize_unless_aborted(self.gate, self.state, call, self.approver, abort, self.classifier)
        if auth is None:
            exc = Aborted("the call was cancelled while it waited for approval: nothing ran", tool=call.name)
            self.records.ended(call, exc, total=_ms_since(started), decided_by="cancelled")
            return _error(exc)
        ran_at = time.monotonic()
        try:
            auth.raise_if_denied()
            self.gate.recheck(auth.decision, params)  # TOCTOU: the target must still be the approved one
            if spec.risk == "write":  # the session's permit, then a slot shared by every session
                async with mutations.mutation(self.write_lock):
                    result = await self._execute(call, auth, on_stdout, on_stderr, abort)
            else:
                result = await self._execute(call, auth, on_stdout, on_stderr, abort)  # 5 execute
        except SandboxError as exc:
            result = _error(exc, root=auth.decision.root)
        if (approval := auth.record()) is not None:  # someone was asked: the result says who answered what
            result.details["approval"] = approval
        self.mutations.guard(call, auth, result)
        try:
            self.records.decided(call, auth, result, started=started, ran_at=ran_at, now=time.monotonic())
        except SandboxError as exc:
            # The call already happened: lose neither its result nor the fact that it went unrecorded.
            result.details["audit_error"] = exc.to_dict()
        return result

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
            return await plugin_execution.run(
                self.jail, plugin_tool, params, env=self.scratch_env(), cwd=str(self.workspace), abort=abort
            )
        tool = TOOLS[call.name]
        target = self._runner_target(params, auth) if tool.needs_target else None
        invocation = Invocation(
            params, target, auth.decision.root, call.tool_call_id, call.turn_id, on_stdout, on_stderr, abort
        )
        if not tool.runs_commands:
            return await tool.run(self, invocation)
        egress, narrower = self.jail.egress, getattr(params, "network_allow", None)  # a Bash call may narrow
        self.network.follow(self.profile, egress)  # the user's network list, saved while the session ran
        with self.network.running(call), egress.narrowed(narrower) if egress else contextlib.nullcontext():
            return await tool.run(self, invocation)

    def shell_for(self, turn_id: str, requested: str | None) -> str:
        """The turn's shell (:class:`sandbox.shells.TurnShells`): its first Bash call pins the effective
        one (the profile's, else the user's default, else the platform's first)."""
        now = shells.effective(self.jail.backend, self.profile.winjob.shell)  # a POSIX jail has bash only
        return self.shells.pin(turn_id, now, requested).id

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
        timeout = float(self.profile.policy.approval_timeout_s)
        return await grants.ask_and_register(
            self.plugins,
            plugin_id,
            self.approver,
            self.records,
            timeout=timeout,
            turn_id=turn_id,
            tool_call_id=tool_call_id,
        )

    def tools_listing(self) -> list[dict[str, Any]]:
        """The tools the model may call in this session now (:func:`~sandbox.session.external.tools_listing`)."""
        return external.tools_listing(self.gate.settings.operating_mode == "agent", self.plugins)

    @property
    def trust(self) -> dict[str, Any]:
        """The project's trust in force now and where it came from (``TrustDecision.explain``): fixed
        when the session opened if its caller, its pre-trust handler or the user decided; else the
        stored decision or the profile's default, re-read as the rules are."""
        default = self.profile.policy.default_project_trust
        trusted, source = self.trust_override
        if trusted is not None:
            return TrustDecision(str(self.workspace), trusted, source).explain(default)
        return TrustStore().decision(self.workspace, default=default == "always").explain(default)

    def plugins_listing(self) -> list[dict[str, Any]]:
        """Every declared plugin and its tools; ``visible``: registered and shown to the model now
        (never in plan or goal)."""
        return self.plugins.listing(self.gate.settings.operating_mode == "agent")

    def mode_notices(self) -> list[Notice]:
        """What the modes in force mean that a user may not expect: plan or goal with ``auto`` still
        runs Bash unasked, and Bash can change the workspace (seed 003: planning intent, not a
        read-only profile)."""
        operating, mode = self.gate.settings.operating_mode, self.gate.mode_for(self.state)
        if operating == "agent" or mode != "auto":
            return []
        message = (
            f"{operating} mode with permission mode auto: Write, Edit and plugin tools are refused, but Bash "
            "runs without asking and can still change the workspace and scratch; choose ask to confirm each command"
        )
        return [{"code": "mode.bash-may-write", "message": message}]

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
        if self.closed:
            return ToolResult(ok=False, error_code="INVALID_ARGUMENT", content="the session is closed")
        try:
            call = external.validated(self.plugins, self.session_id, name, args or {}, call_id, turn_id, user_message)
        except SandboxError as exc:
            self.records.rejected(name, args or {}, call_id, turn_id, exc, total=_ms_since(started))
            return _error(exc)
        self.in_flight += 1
        try:
            return await external.decided(
                self.gate, self.state, self.approver, self.classifier, self.records, call, started
            )
        finally:
            self.in_flight -= 1

    def _runner_target(self, params: BaseModel, auth: Authorization) -> str:
        if isinstance(params, tool_params.GlobParams):
            return self.gate.paths.resolve(params.path or ".").canonical
        assert auth.decision.target is not None
        return auth.decision.target.canonical

    def readable(self, path: str) -> bool:
        """Whether the policy lets the model read ``path`` (a tool shows only what it may)."""
        return self.gate.paths.readable(path)

    # -- session snapshots (sandbox.session.forks) ------------------------------------------------

    async def snapshot(self, *, turn_id: str = "turn-0") -> str:
        """Keep the session's file state (its view, scratch and modes) under a new id; processes are not kept."""
        return (await forks.snapshot(self, turn_id=turn_id)).id

    async def restore(
        self, snapshot_id: str, *, force: bool = False, turn_id: str = "turn-0", tool_call_id: str | None = None
    ) -> dict[str, Any]:
        """Back to ``snapshot_id`` in a new jail (a confirm in ``ask``; see :func:`forks.restore`)."""
        return await forks.restore(self, snapshot_id, force=force, turn_id=turn_id, tool_call_id=tool_call_id)

    async def fork(self, n: int, *, turn_id: str = "turn-0") -> list[Sandbox]:
        """``n`` new sessions from this one's state now, each its own jail and changeset (the caller closes them)."""
        return await forks.fork(self, n, lambda o: Sandbox.create(self.workspace, **o), turn_id=turn_id)

    @classmethod
    async def from_snapshot(
        cls, workspace: str | Path, snapshot_id: str, n: int = 1, **options: Unpack[SessionOptions]
    ) -> list[Sandbox]:
        """``n`` sessions of ``workspace`` opened from ``snapshot_id``, side by side (all or none)."""
        return await forks.open_many(lambda o: cls.create(workspace, **o), snapshot_id, n, options)

    # -- rollback, turns --------------------------------------------------------------------------

    async def rollback(self, snapshot_id: str) -> ToolResult:
        """Undo the Write or Edit that took ``snapshot_id`` (:func:`~sandbox.session.rollback.roll_back`)."""
        return await roll_back(self.jail, self.snapshots, self.write_lock, snapshot_id)

    def end_turn(self, turn_id: str) -> None:
        self.state.end_turn(turn_id)
        self.mutations.end_turn(turn_id)
        self.shells.end_turn(turn_id)

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
        async with self.write_lock:  # not half-way through a Write
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
        if self.closed:
            return
        self.closed = True
        try:
            async with self.write_lock:
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


def _delegate(given: Delegate | dict[str, Any] | None) -> ResolvedDelegate | None:
    if given is None:
        return None
    try:
        return (given if isinstance(given, Delegate) else Delegate.model_validate(given)).resolve()
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'delegate'}: {e['msg']}" for e in exc.errors())
        raise InvalidArgument(f"invalid delegate: {problems}") from exc


def _error(exc: SandboxError, root: Root | None = None) -> ToolResult:
    return ToolResult(ok=False, error_code=exc.code, content=exc.message, details=exc.data, root=root)


def _ms_since(started: float) -> float:
    return round((time.monotonic() - started) * 1000, 3)
