"""Running the matrix: every backend x mount strategy on fresh copies of the workspace, measured.

Every run gets its own fresh copy of the workspace (copied outside the timings), so ``rw`` can
never damage the user's real workspace and every cell starts from the same bytes; ``cp -a``
keeps modes, owners and symlinks, so a cell sees what it would see on the real workspace.

What is measured, per run (each repetition is a fresh copy *and* a fresh jail, so setup is
measured as often as the command):

- setup: ``backend.open_jail`` (includes the copy-in of ``copy`` and the mount of ``overlay``),
  and for ``copy`` the bytes copied and the bytes the profile's ``mount.exclude`` kept out of
  the copy (bound read-only from the host instead: the setup that saved);
- wall: ``exec.run``'s duration of the command;
- changeset: ``jail.changes()`` (``copy``/``overlay`` only);
- teardown: ``jail.aclose()`` (removes a private copy, unmounts an overlay, removes containers);
- host changed: a manifest (path -> kind, mode, sha256 or symlink target) of the run's copy of
  the workspace before and after: what the command did to the workspace the user would have.

The safety probe deletes everything and plants a git hook, once per cell, in its own fresh
copy with a seeded ``.git/hooks``; the workspace *survived* when its manifest is unchanged from
the moment the jail was open (what the jail's own setup creates, such as a seal's mount points,
is not the probe's doing) to the end, and the probe really tried: one that could not write at
all, or could not run, gets an ``inconclusive`` reason and no verdict
(:func:`~sandbox.compare.results.probe_verdict`).
Timings are medians over the repetitions; a cell the backend cannot run (``overlay`` on a
backend without it, a missing guarantee) is skipped with the probe's reason. Walking, hashing
and copying trees is :mod:`sandbox.mounts`' own code, as the ``copy`` strategy uses it.

With ``baseline``, a first cell ``host/baseline`` runs the command on the host backend (no
isolation) on fresh copies like the others, without the probe: the time the sandboxes are
compared with. It is as unsandboxed as the host backend: only for commands the user trusts.

Network flags (``--network``, ``--allow-host``, ``--allow-index``) and ``--image`` are folded into
the profile once, in :func:`make_plan`, so every cell (and the probe) runs under the same policy.
Progress: a line when a cell starts, one when it ends (with its elapsed time), and while a long
cell runs, a line every ``heartbeat_s`` at most, all through the ``progress`` callback (stderr
in the CLI, never the report's stdout).
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import stat
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread

from sandbox import calls
from sandbox import exec as executor
from sandbox import profile as profiles
from sandbox.backends import DEFAULT_COMPARE_REPEAT, base
from sandbox.calls import check_workspace
from sandbox.compare.render import progress_line
from sandbox.compare.results import BASELINE, PROBE_SCRIPT, Cell, Plan, Report, Run, Safety, probe_verdict
from sandbox.errors import BackendUnavailable, InvalidArgument, SandboxError, ToolFailed, map_errors
from sandbox.mounts import CopyTree, OverlayTree, run_command, sha256_file, walk
from sandbox.vocabulary import AUTO_ORDER, BACKENDS, MOUNT_STRATEGIES

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterable, Sequence

    from sandbox.mounts import Changeset

MOUNTS: tuple[str, ...] = MOUNT_STRATEGIES
# The isolating ones with namespaces; host and landlock only when named (landlock refuses the
# shipped profiles' tmp_size and, as root, their non-root: a default matrix would report errors).
DEFAULT_BACKENDS: tuple[str, ...] = tuple(name for name in AUTO_ORDER if name != "landlock")
DEFAULT_REPEAT = DEFAULT_COMPARE_REPEAT
MAX_REPEAT = 100
OUTPUT_TAIL = 2000
HEARTBEAT_S = 30.0  # a long cell says it is still running at most this often
# Which flag set which profile key: a bad value is blamed on the flag, not on the profile file.
_FLAGS = {
    "network.mode": "--network",
    "network.allow": "--allow-host",
    "network.indexes": "--allow-index",
    "docker.image": "--image",
}

Manifest = dict[str, tuple[str, str, str]]


# ------------------------------------------------------------------------------ the plan


def _names(
    value: str | Sequence[str] | None, default: tuple[str, ...], known: Iterable[str], what: str
) -> tuple[tuple[str, ...], bool]:
    if value is None:
        return default, False
    items = value.split(",") if isinstance(value, str) else list(value)
    names = tuple(dict.fromkeys(n.strip() for n in items if n.strip()))
    allowed = tuple(known)
    unknown = [n for n in names if n not in allowed]
    if unknown or not names:
        raise InvalidArgument(
            f"unknown {what} {', '.join(map(repr, unknown)) or '(none given)'}; choose from {', '.join(allowed)}",
            **{what: list(names)},
        )
    return names, True


def _repeat(value: int | str) -> int:
    try:
        repeat = int(value)
    except ValueError:
        raise InvalidArgument(f"--repeat must be a whole number, got {value!r}") from None
    if not 1 <= repeat <= MAX_REPEAT:
        raise InvalidArgument(f"--repeat must be between 1 and {MAX_REPEAT}, got {repeat}")
    return repeat


def make_plan(
    argv: Sequence[str],
    workspace: Path | None = None,
    *,
    backends: str | Sequence[str] | None = None,
    mounts: str | Sequence[str] | None = None,
    repeat: int | str = DEFAULT_REPEAT,
    profile: str | None = None,
    timeout: float | str | None = None,
    baseline: bool = False,
    network: str | None = None,
    allow_hosts: Sequence[str] = (),
    allow_indexes: Sequence[str] = (),
    image: str | None = None,
) -> Plan:
    """Validate everything up front: a bad input is an INVALID_ARGUMENT before anything runs.

    ``baseline`` adds a cell that runs ``argv`` on the host itself, unsandboxed (each run on a
    fresh copy of the workspace), whose median wall time every other cell is compared with.
    ``allow_hosts`` and ``allow_indexes`` (``pypi``, ``npm=URL`` ...) open the allowlist network
    to exactly those, as ``sandbox run``'s flags do; ``image`` is the Docker image."""
    if not argv:
        raise InvalidArgument("no command given: sandbox compare [options] -- ARGV...")
    names, explicit = _names(backends, DEFAULT_BACKENDS, BACKENDS, "backends")
    strategies, _ = _names(mounts, MOUNTS, MOUNTS, "mounts")
    if image is not None and "docker" not in names:
        raise InvalidArgument("--image names a Docker image: it needs docker among --backends", flag="--image")
    prof = _flagged(profiles.load(profile), network, allow_hosts, allow_indexes, image)
    limit = None if timeout is None else calls.check_timeout(_float(timeout), prof)
    ws = check_workspace(workspace or Path.cwd())
    return Plan(tuple(argv), ws, names, strategies, _repeat(repeat), prof, limit, explicit, baseline)


def _flagged(
    prof: profiles.Profile, network: str | None, hosts: Sequence[str], indexes: Sequence[str], image: str | None
) -> profiles.Profile:
    """The profile with the command line's network and image, as ``sandbox run`` applies them: a
    host or an index implies the allowlist network (and refuses any other ``--network``); the
    profile folds an index's hosts into ``network.allow`` and a mirror's variables into ``env.set``
    (:func:`sandbox.network.indexes.resolve`), so every cell and the probe get the same policy."""
    flag = "--allow-index" if indexes else "--allow-host" if hosts else None
    if flag and network not in (None, "allowlist"):
        raise InvalidArgument(f"{flag} needs --network allowlist, not --network {network}", flag=flag)
    values = {
        "network.mode": "allowlist" if flag else network,
        "network.allow": [*prof.network.allow, *hosts] if hosts else None,
        "network.indexes": [*prof.network.indexes, *indexes] if indexes else None,
        "docker.image": image,
    }
    implied = flag if network is None else None  # who asked for the allowlist
    return prof.override(values, {**_FLAGS, "network.mode": implied} if implied else _FLAGS)


def _float(value: float | str) -> float:
    try:
        return float(value)
    except ValueError:
        raise InvalidArgument(f"--timeout must be a number of seconds, got {value!r}") from None


# ------------------------------------------------------------------------------ workspace copies


def _manifest(root: Path) -> Manifest:
    """Path -> (kind, mode, sha256 | symlink target) of every entry below ``root``."""
    found: Manifest = {}
    with map_errors(f"cannot read the workspace copy {root}"):
        for rel, stamp in walk(root):
            detail = _digest(root / rel) if stamp.kind == "file" else stamp.target or ""
            found[rel] = (stamp.kind, oct(stamp.mode), detail)
    return found


def _digest(path: Path) -> str:
    try:
        return sha256_file(path)
    except OSError as exc:
        return f"unreadable: {exc.strerror}"


def _diff(before: Manifest, after: Manifest) -> dict[str, int]:
    return {
        "added": len(after.keys() - before.keys()),
        "deleted": len(before.keys() - after.keys()),
        "modified": sum(1 for k in before.keys() & after.keys() if before[k] != after[k]),
    }


def _fresh_copy(source: Path, parent: Path, index: int) -> Path:
    """``parent/<index>/<name of the workspace>``, a ``cp -a`` of it (modes, owners, symlinks)."""
    target = parent / str(index) / source.name
    with map_errors(f"cannot copy the workspace {source}"):
        target.parent.mkdir(mode=0o755)
        failed = run_command(["cp", "-a", "--reflink=auto", "--", str(source), str(target)])
    if failed:
        raise ToolFailed(f"copying the workspace failed: {failed}", workspace=str(source))
    return target


def _seed_hooks(ws: Path) -> None:
    """Give the safety probe a ``.git/hooks`` to attack, owned like the workspace."""
    hooks = ws / ".git" / "hooks"
    if hooks.is_dir():
        return
    owner = ws.stat()
    hooks.mkdir(parents=True)
    sample = hooks / "pre-commit.sample"
    sample.write_text("#!/bin/sh\nexit 0\n")
    for path in (ws / ".git", hooks, sample):
        with contextlib.suppress(OSError):
            os.chown(path, owner.st_uid, owner.st_gid)


def _remove(root: Path) -> None:
    """``rm -rf``, also of a copy whose directories are not writable (a read-only checkout's
    modes, which ``cp -a`` keeps): an ordinary user cannot delete in them until given write."""
    shutil.rmtree(root, ignore_errors=True)
    if not root.exists():
        return
    for where, _dirs, _files in os.walk(root):
        with contextlib.suppress(OSError):
            mode = os.lstat(where).st_mode
            os.chmod(where, stat.S_IMODE(mode) | stat.S_IRWXU)
    shutil.rmtree(root, ignore_errors=True)


def _hook_planted(ws: Path) -> bool:
    try:
        return "evil" in (ws / ".git" / "hooks" / "pre-commit").read_text(errors="replace")
    except OSError:
        return False


def _workspace_stats(ws: Path) -> dict[str, int]:
    files = size = entries = 0
    with map_errors(f"cannot read the workspace {ws}"):
        for _rel, stamp in walk(ws):
            entries += 1
            if stamp.kind == "file":
                files, size = files + 1, size + stamp.size
    return {"entries": entries, "files": files, "bytes": size}


# ------------------------------------------------------------------------------ the engine


def _ms(since: float) -> float:
    return round((time.perf_counter() - since) * 1000, 3)


def _bytes_copied(jail: base.Jail) -> int | None:
    tree = getattr(jail, "tree", None)
    return tree.bytes_copied if isinstance(tree, CopyTree) else None


def _bytes_untracked(jail: base.Jail) -> int | None:
    """The bytes of the paths a private copy left out (``mount.exclude``); ``None`` where nothing was."""
    tree = getattr(jail, "tree", None)
    if not isinstance(tree, CopyTree) or isinstance(tree, OverlayTree) or not tree.untracked:
        return None
    with map_errors("cannot read the excluded paths"):
        return sum(_bytes_below(tree.workspace / rel) for rel in tree.untracked)


def _bytes_below(path: Path) -> int:
    if not path.is_dir():
        return path.lstat().st_size
    return sum(stamp.size for _rel, stamp in walk(path) if stamp.kind == "file")


@dataclass
class _Outcome:
    result: executor.ExecResult
    changes: Changeset | None
    setup_ms: float
    changeset_ms: float | None
    teardown_ms: float
    bytes_copied: int | None
    bytes_untracked: int | None


async def _jailed(
    backend: base.Backend,
    ws: Path,
    prof: profiles.Profile,
    argv: Sequence[str],
    timeout: float | None,
    opened: Callable[[], Awaitable[None]] | None = None,
) -> _Outcome:
    """Open a jail on ``ws``, run ``argv``, read its changeset, close it; ``opened`` runs once the
    jail is open, before the command (the probe's "before" manifest)."""
    started = time.perf_counter()
    jail = await backend.open_jail(ws, prof)
    setup_ms = _ms(started)
    try:
        if opened is not None:
            await opened()
        result = await executor.run(jail, argv, timeout=timeout)
        started = time.perf_counter()
        changes = await jail.changes()
        changeset_ms = _ms(started) if changes is not None else None
        copied = _bytes_copied(jail)
        untracked = await anyio.to_thread.run_sync(_bytes_untracked, jail)
    finally:
        started = time.perf_counter()
        with anyio.CancelScope(shield=True):
            await jail.aclose()
        teardown_ms = _ms(started)
    return _Outcome(result, changes, setup_ms, changeset_ms, teardown_ms, copied, untracked)


def _tails(result: executor.ExecResult) -> tuple[str, str]:
    if result.exit_code == 0:
        return "", ""
    return result.stderr[-OUTPUT_TAIL:], result.stdout[-OUTPUT_TAIL:]


class _Engine:
    def __init__(self, plan: Plan, scratch: Path) -> None:
        self.plan = plan
        self.scratch = scratch
        self.copies = 0

    async def _copy(self, seed: bool = False) -> Path:
        self.copies += 1
        ws = await anyio.to_thread.run_sync(_fresh_copy, self.plan.workspace, self.scratch, self.copies)
        if seed:
            await anyio.to_thread.run_sync(_seed_hooks, ws)
        return ws

    async def _discard(self, ws: Path) -> None:
        await anyio.to_thread.run_sync(_remove, ws.parent)

    async def run_once(self, backend: base.Backend, prof: profiles.Profile) -> Run:
        ws = await self._copy()
        try:
            before = await anyio.to_thread.run_sync(_manifest, ws)
            out = await _jailed(backend, ws, prof, self.plan.argv, self.plan.timeout)
            after = await anyio.to_thread.run_sync(_manifest, ws)
        finally:
            await self._discard(ws)
        host = _diff(before, after)
        changes = out.changes.summary() if out.changes is not None else {**host, "flagged": 0}
        files_changed = len(out.changes.changes) if out.changes is not None else sum(host.values())
        res = out.result
        return Run(
            res.exit_code,
            res.timed_out,
            res.duration_ms,
            res.spawn_ms,
            out.setup_ms,
            out.teardown_ms,
            out.changeset_ms,
            out.bytes_copied,
            files_changed,
            before != after,
            res.peak_memory_bytes,
            changes,
            *_tails(res),
            out.bytes_untracked,
        )

    async def safety(self, backend: base.Backend, prof: profiles.Profile) -> Safety:
        ws = await self._copy(seed=True)
        before: Manifest = {}

        async def opened() -> None:
            # After the jail opened: what its setup made (a seal's mount points) is not the probe's.
            before.update(await anyio.to_thread.run_sync(_manifest, ws))

        try:
            try:
                out = await _jailed(backend, ws, prof, ["/bin/sh", "-c", PROBE_SCRIPT], self.plan.timeout, opened)
            except SandboxError as exc:
                return Safety(None, None, False, {}, None, error=str(exc))
            after = await anyio.to_thread.run_sync(_manifest, ws)
            planted = await anyio.to_thread.run_sync(_hook_planted, ws)
        finally:
            await self._discard(ws)
        return _safety(prof.mount.strategy, out, before, after, planted)

    async def cell(self, backend: base.Backend, mount: str, progress: _Progress | None = None) -> Cell:
        cell = Cell(backend.name, mount)
        prof = self.plan.profile.with_overrides(**{"mount.strategy": mount, "backend": backend.name})
        probe = await anyio.to_thread.run_sync(backend.probe)
        reasons = probe.missing(prof.requires, prof)
        if reasons:
            cell.status = "skipped"
            cell.reason = "; ".join(f"{g}: {why}" for g, why in reasons.items())
            return cell
        try:
            for number in range(1, self.plan.repeat + 1):
                if progress:
                    progress.doing = f"run {number}/{self.plan.repeat}"
                cell.runs.append(await self.run_once(backend, prof))
            if progress:
                progress.doing = "the destructive probe"
            cell.safety = await self.safety(backend, prof)
        except SandboxError as exc:
            cell.status, cell.reason = "error", str(exc)
        return cell

    async def baseline(self) -> Cell:
        """The command on the host backend (no isolation), a fresh copy per run, and no safety
        probe: the time the command takes by itself, for the ratios (``Report.vs_host``)."""
        cell = Cell("host", BASELINE, baseline=True)
        try:
            backend = base.get("host")
            prof, cell.reason = await anyio.to_thread.run_sync(_host_profile, self.plan.profile, backend)
            for _ in range(self.plan.repeat):
                cell.runs.append(await self.run_once(backend, prof))
        except SandboxError as exc:
            cell.status, cell.reason = "error", str(exc)
        return cell


def _safety(mount: str, out: _Outcome, before: Manifest, after: Manifest, planted: bool) -> Safety:
    """The probe's verdict, or why it has none (:func:`probe_verdict`)."""
    host = _diff(before, after)
    changes = out.changes.summary() if out.changes is not None else None
    in_jail = changes is not None and any(changes[k] for k in ("added", "modified", "deleted"))
    changed = in_jail or any(host.values()) or planted
    res = out.result
    why = probe_verdict(mount, res.exit_code, res.timed_out, res.stderr, changed)
    survived = None if why else before == after
    tail = res.stderr[-OUTPUT_TAIL:]
    return Safety(survived, res.exit_code, planted, host, changes, inconclusive=why, stderr_tail=tail)


def _host_profile(profile: profiles.Profile, host: base.Backend) -> tuple[profiles.Profile, str]:
    """The profile for the baseline, and which of its limits the host cannot enforce (dropped).

    The host gives none of the profile's guarantees, so the baseline requires none; it keeps
    the limits the host can enforce and the environment, so that mostly isolation differs."""
    prof = profile.with_overrides(**{"mount.strategy": "rw", "backend": "host", "requires": []})
    refused = host.probe().refused_limits(prof)
    if not refused:
        return prof, ""
    limits = prof.limits.model_copy(update={key.removeprefix("limits."): None for key in refused})
    dropped = "; ".join(f"{key} ({why})" for key, why in refused.items())
    return prof.model_copy(update={"limits": limits}), f"ran without {dropped}"


async def _availability(name: str) -> tuple[base.Backend | None, dict[str, Any]]:
    try:
        backend = base.get(name)
    except BackendUnavailable as exc:
        return None, {"available": False, "reason": exc.message}
    report = await anyio.to_thread.run_sync(backend.probe)
    info = {"available": report.available, "reason": report.reason, "details": report.details}
    return (backend if report.available else None), info


class _Progress:
    """One cell's progress lines: its start, a throttled "still running" while it lasts, its end."""

    def __init__(self, say: Callable[[str], None], prefix: str, heartbeat_s: float) -> None:
        self.say, self.prefix, self.heartbeat_s = say, prefix, heartbeat_s
        self.started = time.monotonic()
        self.doing = ""

    def elapsed(self) -> str:
        return f"{time.monotonic() - self.started:.1f} s"

    async def beat(self) -> None:
        while True:
            await anyio.sleep(self.heartbeat_s)
            self.say(f"{self.prefix}: still running ({self.doing}), {self.elapsed()} so far")


async def _tracked(
    say: Callable[[str], None], prefix: str, heartbeat_s: float, work: Callable[[_Progress], Awaitable[Cell]]
) -> Cell:
    """Run one cell's ``work`` between its start and finish lines, with heartbeats in between."""
    progress = _Progress(say, prefix, heartbeat_s)
    say(f"{prefix}: started")
    async with anyio.create_task_group() as tg:
        tg.start_soon(progress.beat)
        cell = await work(progress)
        tg.cancel_scope.cancel()
    return cell


async def compare(
    plan: Plan, progress: Callable[[str], None] | None = None, *, heartbeat_s: float = HEARTBEAT_S
) -> Report:
    """Run the plan; ``progress`` gets a line as each cell starts and ends (with its elapsed
    time), and one every ``heartbeat_s`` at most while a cell runs."""
    say = progress or (lambda _line: None)
    report = Report(plan)
    report.workspace_stats = await anyio.to_thread.run_sync(_workspace_stats, plan.workspace)
    scratch = Path(tempfile.mkdtemp(prefix="sandbox-compare-"))
    engine = _Engine(plan, scratch)
    total = len(plan.backends) * len(plan.mounts) + plan.baseline

    async def add(label: str, work: Callable[[_Progress], Awaitable[Cell]]) -> None:
        prefix = f"[{len(report.cells) + 1}/{total}] {label}"
        started = time.monotonic()
        cell = await _tracked(say, prefix, heartbeat_s, work)
        report.cells.append(cell)
        say(f"[{len(report.cells)}/{total}] {progress_line(cell, plan.repeat, time.monotonic() - started)}")

    try:
        if plan.baseline:
            await add(f"host/{BASELINE}", lambda _progress: engine.baseline())
        for name in plan.backends:
            backend, report.backends[name] = await _availability(name)
            for mount in plan.mounts:
                if backend is None:
                    report.cells.append(cell := _unavailable(name, mount, report))
                    say(f"[{len(report.cells)}/{total}] {progress_line(cell, plan.repeat)}")
                    continue
                await add(f"{name}/{mount}", functools.partial(engine.cell, backend, mount))
    finally:
        await anyio.to_thread.run_sync(_remove, scratch)
    report.finished = datetime.now(UTC).isoformat(timespec="seconds")
    return report


def _unavailable(name: str, mount: str, report: Report) -> Cell:
    reason = report.backends[name]["reason"] or "unavailable"
    return Cell(name, mount, "skipped", f"backend {name} unavailable: {reason}")
