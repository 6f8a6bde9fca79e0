"""Compare mount strategies: one command under every backend x strategy, side by side.

Every run gets its own fresh copy of the workspace (copied outside the timings), so ``rw`` can
never damage the user's real workspace and every cell starts from the same bytes; ``cp -a``
keeps modes, owners and symlinks, so a cell sees what it would see on the real workspace.

What is measured, per run (each repetition is a fresh copy *and* a fresh jail, so setup is
measured as often as the command):

- setup: ``backend.open_jail`` (includes the copy-in of ``copy`` and the mount of ``overlay``);
- wall: ``exec.run``'s duration of the command;
- changeset: ``jail.changes()`` (``copy``/``overlay`` only);
- teardown: ``jail.aclose()`` (removes a private copy, unmounts an overlay, removes containers);
- host changed: a manifest (path -> kind, mode, sha256 or symlink target) of the run's copy of
  the workspace before and after: what the command did to the workspace the user would have.

The safety probe deletes everything and plants a git hook, once per cell, in its own fresh
copy with a seeded ``.git/hooks``; the workspace *survived* when its manifest is unchanged.
Timings are medians over the repetitions; a cell the backend cannot run (``overlay`` on a
backend without it, a missing guarantee) is skipped with the probe's reason.
"""

from __future__ import annotations

import contextlib
import hashlib
import html
import json
import math
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import anyio
import anyio.to_thread

from sandbox import __version__, calls
from sandbox import exec as executor
from sandbox import profile as profiles
from sandbox.backends import BACKENDS, DEFAULT_COMPARE_REPEAT, MOUNT_STRATEGIES, base
from sandbox.calls import check_workspace
from sandbox.errors import BackendUnavailable, InvalidArgument, SandboxError, ToolFailed, map_errors
from sandbox.mounts import CopyTree, walk

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

    from sandbox.mounts import Changeset

MOUNTS: tuple[str, ...] = MOUNT_STRATEGIES
DEFAULT_BACKENDS: tuple[str, ...] = ("bwrap", "docker")
DEFAULT_REPEAT = DEFAULT_COMPARE_REPEAT
MAX_REPEAT = 100
PROBE_SCRIPT = (
    "rm -rf ./* ./.[!.]* 2>/dev/null; "
    "mkdir -p .git/hooks && echo 'echo evil' > .git/hooks/pre-commit && chmod +x .git/hooks/pre-commit"
)
OUTPUT_TAIL = 2000
REPORT_FILES = ("report.json", "report.md", "chart.svg", "table.txt")

CellStatus = Literal["ran", "skipped", "error"]
Manifest = dict[str, tuple[str, str, str]]


# ------------------------------------------------------------------------------ the plan


@dataclass(frozen=True)
class Plan:
    argv: tuple[str, ...]
    workspace: Path
    backends: tuple[str, ...]
    mounts: tuple[str, ...]
    repeat: int
    profile: profiles.Profile
    timeout: float | None
    explicit_backends: bool


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
) -> Plan:
    """Validate everything up front: a bad input is an INVALID_ARGUMENT before anything runs."""
    if not argv:
        raise InvalidArgument("no command given: sandbox compare [options] -- ARGV...")
    names, explicit = _names(backends, DEFAULT_BACKENDS, BACKENDS, "backends")
    strategies, _ = _names(mounts, MOUNTS, MOUNTS, "mounts")
    prof = profiles.load(profile)
    limit = None if timeout is None else calls.check_timeout(_float(timeout), prof)
    ws = check_workspace(workspace or Path.cwd())
    return Plan(tuple(argv), ws, names, strategies, _repeat(repeat), prof, limit, explicit)


def _float(value: float | str) -> float:
    try:
        return float(value)
    except ValueError:
        raise InvalidArgument(f"--timeout must be a number of seconds, got {value!r}") from None


# ------------------------------------------------------------------------------ results


@dataclass
class Run:
    exit_code: int
    timed_out: bool
    wall_ms: float
    spawn_ms: float
    setup_ms: float
    teardown_ms: float
    changeset_ms: float | None
    bytes_copied: int | None
    files_changed: int
    host_changed: bool
    peak_memory_bytes: int | None
    changes: dict[str, int]
    stderr_tail: str = ""  # kept when the command failed: why it failed under this strategy
    stdout_tail: str = ""


@dataclass
class Safety:
    survived: bool | None  # None: the probe could not run (see ``error``)
    exit_code: int | None
    hook_planted: bool
    host_changes: dict[str, int]
    changes: dict[str, int] | None
    error: str = ""


@dataclass
class Cell:
    backend: str
    mount: str
    status: CellStatus = "ran"
    reason: str = ""
    runs: list[Run] = field(default_factory=list)
    safety: Safety | None = None

    @property
    def label(self) -> str:
        return f"{self.backend}/{self.mount}"

    def median(self, key: str) -> float | None:
        values = [v for r in self.runs if (v := getattr(r, key)) is not None]
        return round(float(statistics.median(values)), 3) if values else None

    @property
    def exit_codes(self) -> list[int]:
        return [r.exit_code for r in self.runs]

    @property
    def failure(self) -> str:
        """The last line a failing run wrote (stderr, else stdout): why the command failed here."""
        for run in self.runs:
            lines = [line for line in (run.stderr_tail or run.stdout_tail).splitlines() if line.strip()]
            if run.exit_code and lines:
                return lines[-1][:200]
        return ""

    @property
    def host_changed(self) -> bool | None:
        return any(r.host_changed for r in self.runs) if self.runs else None

    def summary(self) -> dict[str, Any]:
        """The figures the table shows: medians over runs, the last run's counts."""
        last = self.runs[-1] if self.runs else None
        return {
            "exit_codes": self.exit_codes,
            "timed_out": any(r.timed_out for r in self.runs),
            **{
                k: self.median(k)
                for k in ("wall_ms", "setup_ms", "teardown_ms", "changeset_ms", "spawn_ms", "peak_memory_bytes")
            },
            "bytes_copied": last.bytes_copied if last else None,
            "files_changed": last.files_changed if last else None,
            "host_changed": self.host_changed,
            "changes": last.changes if last else None,
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "mount": self.mount,
            "status": self.status,
            "reason": self.reason,
            **(self.summary() if self.status == "ran" else {}),
            "runs": [asdict(r) for r in self.runs],
            "safety": asdict(self.safety) if self.safety else None,
        }


@dataclass
class Report:
    plan: Plan
    backends: dict[str, dict[str, Any]] = field(default_factory=dict)
    cells: list[Cell] = field(default_factory=list)
    started: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))
    finished: str = ""
    workspace_stats: dict[str, int] = field(default_factory=dict)

    @property
    def ran(self) -> list[Cell]:
        return [c for c in self.cells if c.status == "ran"]

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": 1,
            "sandbox": __version__,
            "started": self.started,
            "finished": self.finished,
            "command": list(self.plan.argv),
            "workspace": str(self.plan.workspace),
            "workspace_stats": self.workspace_stats,
            "repeat": self.plan.repeat,
            "profile": self.plan.profile.name,
            "timeout_s": self.plan.timeout,
            "mounts": list(self.plan.mounts),
            "host": _host(),
            "backends": self.backends,
            "safety_probe": PROBE_SCRIPT,
            "cells": [c.to_dict() for c in self.cells],
        }


def exit_status(report: Report) -> int:
    """0: every cell ran or was skipped for a reason; 2: an explicitly named backend is unavailable;
    1: a cell failed to run (the sandbox refused or broke; a failing *command* is data, not this)."""
    if report.plan.explicit_backends and any(not b["available"] for b in report.backends.values()):
        return 2
    return 1 if any(c.status == "error" for c in report.cells) else 0


def _host() -> dict[str, Any]:
    return {
        "hostname": platform.node(),
        "kernel": platform.release(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "euid": os.geteuid(),
    }


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
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        return f"unreadable: {exc.strerror}"
    with os.fdopen(fd, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


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
        done = subprocess.run(
            ["cp", "-a", "--reflink=auto", "--", str(source), str(target)], capture_output=True, text=True, check=False
        )
    if done.returncode != 0:
        raise ToolFailed(f"copying the workspace failed: {done.stderr.strip()}", workspace=str(source))
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


@dataclass
class _Outcome:
    result: executor.ExecResult
    changes: Changeset | None
    setup_ms: float
    changeset_ms: float | None
    teardown_ms: float
    bytes_copied: int | None


async def _jailed(
    backend: base.Backend, ws: Path, prof: profiles.Profile, argv: Sequence[str], timeout: float | None
) -> _Outcome:
    started = time.perf_counter()
    jail = await backend.open_jail(ws, prof)
    setup_ms = _ms(started)
    try:
        result = await executor.run(jail, argv, timeout=timeout)
        started = time.perf_counter()
        changes = await jail.changes()
        changeset_ms = _ms(started) if changes is not None else None
        copied = _bytes_copied(jail)
    finally:
        started = time.perf_counter()
        with anyio.CancelScope(shield=True):
            await jail.aclose()
        teardown_ms = _ms(started)
    return _Outcome(result, changes, setup_ms, changeset_ms, teardown_ms, copied)


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
        await anyio.to_thread.run_sync(shutil.rmtree, ws.parent, True)

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
        )

    async def safety(self, backend: base.Backend, prof: profiles.Profile) -> Safety:
        ws = await self._copy(seed=True)
        try:
            before = await anyio.to_thread.run_sync(_manifest, ws)
            try:
                out = await _jailed(backend, ws, prof, ["sh", "-c", PROBE_SCRIPT], self.plan.timeout)
            except SandboxError as exc:
                return Safety(None, None, False, {}, None, error=str(exc))
            after = await anyio.to_thread.run_sync(_manifest, ws)
            planted = await anyio.to_thread.run_sync(_hook_planted, ws)
        finally:
            await self._discard(ws)
        changes = out.changes.summary() if out.changes is not None else None
        return Safety(before == after, out.result.exit_code, planted, _diff(before, after), changes)

    async def cell(self, backend: base.Backend, mount: str) -> Cell:
        cell = Cell(backend.name, mount)
        prof = self.plan.profile.with_overrides(**{"mount.strategy": mount, "backend": backend.name})
        probe = await anyio.to_thread.run_sync(backend.probe)
        reasons = probe.missing(prof.requires, prof)
        if reasons:
            cell.status = "skipped"
            cell.reason = "; ".join(f"{g}: {why}" for g, why in reasons.items())
            return cell
        try:
            for _ in range(self.plan.repeat):
                cell.runs.append(await self.run_once(backend, prof))
            cell.safety = await self.safety(backend, prof)
        except SandboxError as exc:
            cell.status, cell.reason = "error", str(exc)
        return cell


async def _availability(name: str) -> tuple[base.Backend | None, dict[str, Any]]:
    try:
        backend = base.get(name)
    except BackendUnavailable as exc:
        return None, {"available": False, "reason": exc.message}
    report = await anyio.to_thread.run_sync(backend.probe)
    info = {"available": report.available, "reason": report.reason, "details": report.details}
    return (backend if report.available else None), info


async def compare(plan: Plan, progress: Callable[[str], None] | None = None) -> Report:
    """Run the plan; ``progress`` gets one line per cell as it finishes."""
    say = progress or (lambda _line: None)
    report = Report(plan)
    report.workspace_stats = await anyio.to_thread.run_sync(_workspace_stats, plan.workspace)
    scratch = Path(tempfile.mkdtemp(prefix="sandbox-compare-"))
    engine = _Engine(plan, scratch)
    total = len(plan.backends) * len(plan.mounts)
    try:
        for name in plan.backends:
            backend, report.backends[name] = await _availability(name)
            for mount in plan.mounts:
                cell = await engine.cell(backend, mount) if backend else _unavailable(name, mount, report)
                report.cells.append(cell)
                say(f"[{len(report.cells)}/{total}] {progress_line(cell, plan.repeat)}")
    finally:
        await anyio.to_thread.run_sync(shutil.rmtree, scratch, True)
    report.finished = datetime.now(UTC).isoformat(timespec="seconds")
    return report


def _unavailable(name: str, mount: str, report: Report) -> Cell:
    reason = report.backends[name]["reason"] or "unavailable"
    return Cell(name, mount, "skipped", f"backend {name} unavailable: {reason}")


def progress_line(cell: Cell, repeat: int) -> str:
    if cell.status != "ran":
        return f"{cell.label}: {cell.status}: {cell.reason}"
    survived = {"yes": "survived", "NO": "host DAMAGED"}.get(_survived(cell), _survived(cell))
    why = f" ({cell.failure})" if cell.failure else ""
    return (
        f"{cell.label}: exit {_exits(cell)}{why}, wall {_num(cell.median('wall_ms'))} ms "
        f"(median of {repeat}), setup {_num(cell.median('setup_ms'))} ms, "
        f"teardown {_num(cell.median('teardown_ms'))} ms; destructive probe: {survived}"
    )


# ------------------------------------------------------------------------------ formatting


def _num(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.1f}"


def _size(value: float | None) -> str:
    if value is None:
        return "n/a"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return "n/a"  # unreachable


def _exits(cell: Cell) -> str:
    if any(r.timed_out for r in cell.runs):
        return "timeout"
    codes = cell.exit_codes
    return str(codes[0]) if len(set(codes)) == 1 else "/".join(map(str, codes))


def _changes(summary: dict[str, int] | None) -> str:
    if summary is None:
        return "n/a"
    text = f"+{summary['added']} ~{summary['modified']} -{summary['deleted']}"
    return text + (f" !{summary['flagged']}" if summary.get("flagged") else "")


def _yes_no(value: bool | None) -> str:
    return "n/a" if value is None else ("yes" if value else "no")


def _survived(cell: Cell) -> str:
    if cell.safety is None:
        return "n/a"
    if cell.safety.error:
        return "error"
    return "yes" if cell.safety.survived else "NO"


HEADERS = (
    "backend",
    "mount",
    "exit",
    "wall ms",
    "setup ms",
    "teardown ms",
    "changeset ms",
    "copied",
    "files changed",
    "host changed",
    "peak mem",
    "changes",
    "survives probe",
)


def rows(report: Report) -> list[list[str]]:
    out = []
    for cell in report.cells:
        if cell.status != "ran":
            out.append([cell.backend, cell.mount, cell.status, *["-"] * (len(HEADERS) - 3)])
            continue
        s = cell.summary()
        out.append(
            [
                cell.backend,
                cell.mount,
                _exits(cell),
                _num(s["wall_ms"]),
                _num(s["setup_ms"]),
                _num(s["teardown_ms"]),
                _num(s["changeset_ms"]),
                _size(s["bytes_copied"]),
                str(s["files_changed"]),
                _yes_no(s["host_changed"]),
                _size(s["peak_memory_bytes"]),
                _changes(s["changes"]),
                _survived(cell),
            ]
        )
    return out


def table(report: Report) -> str:
    """The plain-text table for a terminal: aligned columns, skipped cells' reasons below."""
    body = [list(HEADERS), *rows(report)]
    widths = [max(len(r[i]) for r in body) for i in range(len(HEADERS))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in body]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines += [f"{c.label} {c.status}: {c.reason}" for c in report.cells if c.status != "ran"]
    return "\n".join(lines) + "\n"


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(report: Report, chart: str | None = "chart.svg") -> str:
    plan = report.plan
    stats = report.workspace_stats
    lines = [
        "# sandbox compare",
        "",
        f"Command `{_md_cell(shlex.join(plan.argv))}` on a fresh copy of `{plan.workspace}` "
        f"({stats.get('files', 0)} files, {_size(stats.get('bytes', 0))}) per run, profile `{plan.profile.name}`, "
        f"{plan.repeat} run(s) per cell (times are medians, in ms). {report.started} - {report.finished}.",
        "",
        "| " + " | ".join(HEADERS) + " |",
        "|" + "|".join("---" for _ in HEADERS) + "|",
        *("| " + " | ".join(_md_cell(v) for v in r) + " |" for r in rows(report)),
        "",
    ]
    skipped = [c for c in report.cells if c.status != "ran"]
    if skipped:
        lines += ["Not run:", "", *(f"- `{c.label}` {c.status}: {_md_cell(c.reason)}" for c in skipped), ""]
    failed = [c for c in report.ran if c.failure]
    if failed:
        lines += [
            "Command failures (the last line it printed):",
            "",
            *(f"- `{c.label}` exit {_exits(c)}: `{_md_cell(c.failure)}`" for c in failed),
            "",
        ]
    if chart:
        lines += [f"![time per backend and mount strategy]({chart})", ""]
    lines += _md_safety(report) + _md_legend()
    return "\n".join(lines)


def _md_safety(report: Report) -> list[str]:
    lines = [
        "## What each strategy protects",
        "",
        f"Destructive probe, on its own fresh copy with a seeded `.git/hooks`: `{_md_cell(PROBE_SCRIPT)}`",
        "",
        "| backend | mount | probe exit | host workspace survived | host changes | hook planted on host "
        "| changeset (what `--apply` would bring back) |",
        "|---|---|---|---|---|---|---|",
    ]
    for cell in report.ran:
        s = cell.safety
        if s is None:
            continue
        exit_text = "n/a" if s.exit_code is None else str(s.exit_code)
        lines.append(
            f"| {cell.backend} | {cell.mount} | {exit_text} | {_survived(cell)} | "
            f"{_changes(s.host_changes) if not s.error else _md_cell(s.error)} | {_yes_no(s.hook_planted)} | "
            f"{_changes(s.changes)} |"
        )
    return [*lines, ""]


def _md_legend() -> list[str]:
    return [
        "## Columns",
        "",
        "- **setup**: opening the jail (the copy-in for `copy`, the mount for `overlay`); **teardown**: closing it;",
        "  **changeset**: computing what a `copy`/`overlay` jail changed; **wall**: the command itself.",
        "- **copied**: bytes copied into a private tree; **files changed**: entries the command added, modified or",
        "  deleted (the changeset for `copy`/`overlay`, the workspace itself for `ro`/`rw`); **host changed**:",
        "  whether the workspace the user would have was modified; **changes**: `+added ~modified -deleted !flagged`.",
        "- **peak mem**: the call's peak memory (cgroup), `n/a` where the backend cannot tell.",
        "",
    ]


# ------------------------------------------------------------------------------ the chart


SERIES = (
    ("setup_ms", "setup", "#4e79a7"),
    ("wall_ms", "command (wall)", "#f28e2b"),
    ("teardown_ms", "teardown", "#59a14f"),
)
_BAR_W, _GAP, _LEFT, _TOP, _PLOT_H = 22, 26, 64, 76, 240


def _scale(value: float) -> tuple[float, int]:
    """A round tick step (1, 2 or 5 x 10^k) and the number of ticks that covers ``value``."""
    if value <= 0:
        return 1.0, 1
    rough = value / 5
    power = 10.0 ** math.floor(math.log10(rough))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= rough)
    return step, max(1, math.ceil(value / step - 1e-9))


def svg(report: Report) -> str:
    """Grouped bars, one group per backend/mount, hand-written SVG (no plotting dependency)."""
    group_w = len(SERIES) * _BAR_W + _GAP
    width = max(600, _LEFT + len(report.cells) * group_w + 40)
    height = _TOP + _PLOT_H + 50
    step, ticks = _scale(max([c.median(k) or 0.0 for c in report.ran for k, _, _ in SERIES] + [0.0]))
    top = step * ticks
    command = html.escape(shlex.join(report.plan.argv))
    files = report.workspace_stats.get("files", 0)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{_LEFT}" y="20" font-size="14" font-weight="bold">sandbox compare: median ms per '
        f"backend and mount strategy ({report.plan.repeat} run(s) each)</text>",
        f'<text x="{_LEFT}" y="37" fill="#555">{command} on {files} files</text>',
        *_axis(step, ticks, width),
        *_legend(),
    ]
    for index, cell in enumerate(report.cells):
        parts += _group(cell, _LEFT + 14 + index * group_w, top)
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def _y(value: float, top: float) -> float:
    return _TOP + _PLOT_H - value / top * _PLOT_H


def _axis(step: float, ticks: int, width: int) -> list[str]:
    mid = _TOP + _PLOT_H / 2
    out = [
        f'<line x1="{_LEFT}" y1="{_TOP + _PLOT_H}" x2="{width - 20}" y2="{_TOP + _PLOT_H}" stroke="#333"/>',
        f'<text x="14" y="{mid}" transform="rotate(-90 14 {mid})" text-anchor="middle">milliseconds</text>',
    ]
    for tick in range(ticks + 1):
        y = _y(step * tick, step * ticks)
        out += [
            f'<line x1="{_LEFT}" y1="{y:.1f}" x2="{width - 20}" y2="{y:.1f}" stroke="#e4e4e4"/>',
            f'<text x="{_LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{step * tick:g}</text>',
        ]
    return out


def _legend() -> list[str]:
    out = []
    for i, (_key, name, color) in enumerate(SERIES):
        x = _LEFT + i * 120
        out += [
            f'<rect class="legend" x="{x}" y="47" width="10" height="10" fill="{color}"/>',
            f'<text x="{x + 14}" y="56">{name}</text>',
        ]
    return out


def _group(cell: Cell, x: float, top: float) -> list[str]:
    base_y = _TOP + _PLOT_H
    mid = x + len(SERIES) * _BAR_W / 2
    label = [
        f'<text x="{mid}" y="{base_y + 16}" text-anchor="middle">{cell.backend}</text>',
        f'<text x="{mid}" y="{base_y + 30}" text-anchor="middle" font-weight="bold">{cell.mount}</text>',
    ]
    if cell.status != "ran":
        reason = html.escape(cell.reason)
        return [
            *label,
            f'<text class="skipped" x="{mid}" y="{base_y - 8}" text-anchor="middle" fill="#999">'
            f"<title>{reason}</title>{cell.status}</text>",
        ]
    bars = []
    for i, (key, name, color) in enumerate(SERIES):
        value = cell.median(key) or 0.0
        y = _y(value, top)
        bx = x + i * _BAR_W
        bars += [
            f'<rect class="bar" data-cell="{cell.label}" data-series="{key}" data-value="{value}" '
            f'x="{bx}" y="{y:.1f}" width="{_BAR_W - 2}" height="{base_y - y:.1f}" fill="{color}">'
            f"<title>{cell.label} {name}: {value} ms</title></rect>",
            f'<text x="{bx + (_BAR_W - 2) / 2}" y="{y - 3:.1f}" text-anchor="middle" font-size="9">'
            f"{_num(value)}</text>",
        ]
    return label + bars


# ------------------------------------------------------------------------------ report files


def write(report: Report, directory: Path) -> list[Path]:
    """report.json, report.md, chart.svg and table.txt in ``directory`` (created); returns their paths."""
    with map_errors(f"cannot write the report to {directory}"):
        directory.mkdir(parents=True, exist_ok=True)
        paths = [directory / name for name in REPORT_FILES]
        contents = (json.dumps(report.to_dict(), indent=2) + "\n", markdown(report), svg(report), table(report))
        for path, text in zip(paths, contents, strict=True):
            path.write_text(text, encoding="utf-8")
    return paths
