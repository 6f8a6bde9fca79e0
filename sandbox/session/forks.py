"""A session's snapshot, restore and fork (issue 39; the design: ``docs/snapshots.md``).

A snapshot is taken between calls (the session's write lock held, no call in flight), so no
command of the jail writes the tree while it is read: the jail's only process then is a warm
jail's idle agent. A restore is a new jail over the workspace and the snapshot's layer (its
processes are not carried, as a fork's are not), swapped in for the old one, whose tree goes; the
scratch directory and the session's settings come back with it. Restoring discards the view's
current state, so it passes the gate as a mutation: a confirm in ``ask``, refused in plan and
goal. Each operation is one audit row (``session.snapshot``, ``session.restore``, ``session.fork``).
"""

from __future__ import annotations

import functools
import time
import uuid
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import anyio

from sandbox import snapshots
from sandbox.backends import seal
from sandbox.errors import Conflict, InvalidArgument, ToolDenied
from sandbox.policy.approvals import ApprovalOutcome, ApprovalRequest, decide
from sandbox.threads import off_loop

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from pathlib import Path

    from sandbox.backends.base import Backend, Jail
    from sandbox.policy.approvals import Approver
    from sandbox.policy.gate import Gate, SessionState
    from sandbox.profile import Profile
    from sandbox.session.opening import SessionOptions
    from sandbox.session.records import Recorder

MAX_FORKS = 16  # sessions one fork opens


class Session(Protocol):
    """What a snapshot, a restore and a fork use of a session (:class:`sandbox.session.Sandbox`)."""

    session_id: str
    workspace: Path
    scratch: Path
    profile: Profile
    jail: Jail
    gate: Gate
    state: SessionState
    approver: Approver
    records: Recorder
    lineage: str
    current_snapshot: str | None
    backend: Backend | None
    shared: tuple[tuple[str, str], ...]
    options: SessionOptions
    closed: bool
    in_flight: int
    write_lock: anyio.Lock

    def listen_to(self, jail: Jail) -> None: ...

    async def aclose(self) -> None: ...


S = TypeVar("S", bound=Session)


def settings_of(sandbox: Session) -> dict[str, Any]:
    """What later calls depend on beyond the files: the permission and operating modes."""
    return {"mode": sandbox.state.mode, "operating_mode": sandbox.gate.settings.operating_mode}


def adopt_settings(sandbox: Session, settings: dict[str, Any]) -> None:
    sandbox.state.mode = settings.get("mode")
    operating = settings.get("operating_mode") or "agent"
    sandbox.gate.settings = sandbox.gate.settings.model_copy(update={"operating_mode": operating})


def _backend(sandbox: Session) -> Backend:
    if sandbox.backend is None:
        raise InvalidArgument("this session was not opened by Sandbox.create: it has no backend to snapshot with")
    return sandbox.backend


def _between_calls(sandbox: Session, what: str) -> None:
    if sandbox.closed:
        raise InvalidArgument("the session is closed", session_id=sandbox.session_id)
    if sandbox.in_flight:
        raise Conflict(
            f"the session has {sandbox.in_flight} call(s) in flight; {what} between calls",
            session_id=sandbox.session_id,
        )


async def snapshot(sandbox: Session, *, turn_id: str = "turn-0") -> snapshots.Snapshot:
    """The session's file state now, kept under a new id."""
    started = time.monotonic()
    call_id = f"snapshot-{uuid.uuid4().hex[:12]}"
    async with sandbox.write_lock:
        try:
            _between_calls(sandbox, "snapshot it")
            _backend(sandbox).check_snapshots(sandbox.profile)
            tree = sandbox.jail.tree
            if tree is None or not tree.snapshots:
                raise InvalidArgument(
                    "this jail's private tree is not on this host (a remote engine's); it cannot be snapshotted",
                    backend=sandbox.jail.backend,
                )
            limits = sandbox.profile.limits
            snap = await off_loop(
                lambda: snapshots.take(
                    tree,
                    sandbox.scratch,
                    lineage=sandbox.lineage,
                    session_id=sandbox.session_id,
                    backend=sandbox.jail.backend,
                    mount=sandbox.jail.mount,
                    parent=sandbox.current_snapshot,
                    settings=settings_of(sandbox),
                    caps=(limits.snapshots, limits.snapshot_bytes),
                    leave_out=functools.partial(seal.sealed, sandbox.workspace, sandbox.profile.policy.deny_read),
                )
            )
        except Exception as exc:
            sandbox.records.state_change("session.snapshot", {}, call_id, turn_id, total=_ms(started), error=exc)
            raise
    sandbox.current_snapshot = snap.id
    data = {"snapshot_id": snap.id, "kind": snap.kind, "changed": len(snap.delta.present), "bytes": snap.delta.bytes}
    sandbox.records.state_change("session.snapshot", data, call_id, turn_id, total=_ms(started))
    return snap


async def restore(
    sandbox: Session,
    snapshot_id: str,
    *,
    force: bool = False,
    turn_id: str = "turn-0",
    tool_call_id: str | None = None,
) -> dict[str, Any]:
    """Bring the session back to ``snapshot_id`` (see the module's doc); what was restored."""
    started = time.monotonic()
    call_id = tool_call_id or f"restore-{uuid.uuid4().hex[:12]}"
    data: dict[str, Any] = {"snapshot_id": snapshot_id, "force": force}
    asked: list[ApprovalOutcome] = []  # the user's word, when asked
    try:
        snap = await off_loop(snapshots.read, snapshot_id)
        backend = _backend(sandbox)
        backend.check_snapshots(sandbox.profile)
        check_line(sandbox, snap)
        await _approved(sandbox, snap, call_id, turn_id, asked)
        async with sandbox.write_lock:
            _between_calls(sandbox, "restore it")
            conflicts = await off_loop(lambda: snap.check_host(sandbox.workspace, force=force))
            jail = await backend.open_jail(
                sandbox.workspace, sandbox.profile, scratch=sandbox.scratch, shared=sandbox.shared, seed=snap
            )
            old, sandbox.jail = sandbox.jail, jail
            await old.aclose()  # its tree goes: the restore replaces the view it held
            await off_loop(snapshots.restore_scratch, snap, sandbox.scratch)
            adopt_settings(sandbox, snap.settings)
            sandbox.listen_to(jail)
            sandbox.current_snapshot = snap.id
            snap.touch()
    except Exception as exc:
        sandbox.records.state_change(
            "session.restore", data, call_id, turn_id, total=_ms(started), error=exc, asked=asked[0] if asked else None
        )
        raise
    data.update(changed=len(snap.delta.present), host_changed=conflicts)
    sandbox.records.state_change(
        "session.restore", data, call_id, turn_id, total=_ms(started), asked=asked[0] if asked else None
    )
    return {**data, "took_ms": _ms(started)}


def check_line(sandbox: Session, snap: snapshots.Snapshot, instead: str = "Sandbox.from_snapshot") -> None:
    """INVALID_ARGUMENT for a snapshot of another workspace, or of another line of sessions than
    ``sandbox``'s; ``instead`` names the way to open a session from it."""
    snap.check_workspace(sandbox.workspace)
    if snap.lineage != sandbox.lineage:
        raise InvalidArgument(
            f"snapshot {snap.id} was taken in another line of sessions ({snap.lineage}); a session restores "
            f"its own line's snapshots only (open a session from it instead: {instead})",
            snapshot_id=snap.id,
        )


async def _approved(
    sandbox: Session, snap: snapshots.Snapshot, call_id: str, turn_id: str, asked: list[ApprovalOutcome]
) -> None:
    """Refused in plan and goal; asked in ``ask`` (it discards the view's state); the wait in ms."""
    operating = sandbox.gate.settings.operating_mode
    if operating != "agent":
        raise ToolDenied(f"{operating} mode refuses a restore: it changes the workspace view", tool="session.restore")
    if sandbox.gate.mode_for(sandbox.state) != "ask":
        return
    request = ApprovalRequest(
        session_id=sandbox.session_id,
        turn_id=turn_id,
        tool_call_id=call_id,
        tool="session.restore",
        operation="write",
        resource=f"{sandbox.workspace} <- {snap.id}",
        reason=f"restoring snapshot {snap.id} discards what the session changed since",
        rule_id="session.restore",
        allow_session=False,
    )
    outcome = await decide(sandbox.approver, request, float(sandbox.profile.policy.approval_timeout_s))
    asked.append(outcome)
    if not outcome.allowed:
        raise ToolDenied(outcome.reason, tool="session.restore", decided_by=outcome.decided_by)


async def fork(sandbox: Session, n: int, opener: Callable[[SessionOptions], Awaitable[S]], *, turn_id: str) -> list[S]:
    """``n`` sessions opened (by ``opener``) from a snapshot of ``sandbox`` now, with its profile,
    approver and mode."""
    if not 1 <= n <= MAX_FORKS:
        raise InvalidArgument(f"a fork makes 1 to {MAX_FORKS} sessions, not {n}", n=n)
    snap = await snapshot(sandbox, turn_id=turn_id)
    options: SessionOptions = {**sandbox.options, "profile": sandbox.profile, "approver": sandbox.approver}
    options["mode"] = sandbox.state.mode
    return await open_many(opener, snap.id, n, options)


async def seed_for(
    snapshot_id: str | None, workspace: Path, backend: Backend, profile: Profile
) -> snapshots.Snapshot | None:
    """The snapshot a session opens from (``from_snapshot``), checked against its workspace and the
    host (CONFLICT where the host changed a path of it since), or ``None``."""
    if snapshot_id is None:
        return None
    snap = await off_loop(snapshots.read, snapshot_id)
    backend.check_snapshots(profile)
    snap.check_workspace(workspace)
    await off_loop(snap.check_host, workspace)
    return snap


async def started_from(sandbox: Session, snap: snapshots.Snapshot, options: SessionOptions) -> None:
    """A session opened from ``snap``: its scratch, modes (unless ``options`` name them) and line; its
    first audit row names the parent."""
    started = time.monotonic()
    await off_loop(snapshots.restore_scratch, snap, sandbox.scratch)
    given = {key: options.get(key) for key in ("mode", "operating_mode")}
    adopt_settings(sandbox, {**snap.settings, **{k: v for k, v in given.items() if v is not None}})
    sandbox.lineage, sandbox.current_snapshot = snap.lineage, snap.id
    snap.touch()
    data = {"snapshot_id": snap.id, "parent_session": snap.session_id, "lineage": snap.lineage}
    sandbox.records.state_change("session.fork", data, f"fork-{uuid.uuid4().hex[:12]}", "turn-0", total=_ms(started))


async def open_many(
    opener: Callable[[SessionOptions], Awaitable[S]], snapshot_id: str, n: int, options: SessionOptions
) -> list[S]:
    """``n`` sessions opened from one snapshot side by side; one failing closes the others."""
    if not 1 <= n <= MAX_FORKS:
        raise InvalidArgument(f"a fork makes 1 to {MAX_FORKS} sessions, not {n}", n=n)
    opened: list[S] = []
    given: SessionOptions = {**options, "from_snapshot": snapshot_id}
    given.pop("session_id", None)  # each fork is a session of its own

    async def one() -> None:
        opened.append(await opener(given))

    try:
        async with anyio.create_task_group() as tg:
            for _ in range(n):
                tg.start_soon(one)
    except BaseException as exc:
        with anyio.CancelScope(shield=True):
            for session in opened:
                await session.aclose()
        first = exc
        while isinstance(first, BaseExceptionGroup) and isinstance(first.exceptions[0], Exception):
            first = first.exceptions[0]  # the first refusal, as one session's open would raise it
        if first is not exc:
            raise first from None
        raise
    return opened


def _ms(started: float) -> float:
    return round((time.monotonic() - started) * 1000, 3)
