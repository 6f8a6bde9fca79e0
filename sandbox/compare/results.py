"""What a comparison is made of: the plan it runs, and per cell the runs, the safety probe's
verdict and the medians the renderings show (:mod:`sandbox.compare.render`).

A cell is one backend x mount strategy; it *ran*, was *skipped* for a stated reason (the
backend is unavailable, or cannot give a guarantee the profile requires), or is an *error* (the
sandbox refused or broke). A command failing in a cell is data, not an error: the cell is
``failed`` and the renderings mark it. Under ``--baseline`` the first cell, ``host/baseline``, ran
the command unsandboxed, and every cell's ``vs_host`` is its median wall time over that one's.

The probe's verdict is only as good as the probe's own attempt: a workspace that "survived" a
probe that could not write at all (the jail's user lacks permission, a tool is missing, the
probe timed out) proves nothing about the strategy, so :func:`probe_verdict` turns that into an
``inconclusive`` reason instead of a ``yes``. Only ``ro`` may be credited for a probe that changed
nothing, and only when every refusal it met was the read-only mount's own (EROFS).

A failed cell's reason is :func:`relevant_line` of its output: the last line that reads like an
error, never a trailing warning, notice or version banner.
"""

from __future__ import annotations

import os
import platform
import re
import statistics
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

from sandbox import __version__

if TYPE_CHECKING:
    from pathlib import Path

    from sandbox import profile as profiles

# The probe's stderr is kept (not thrown away): its refusals tell a strategy's protection (EROFS
# under ro) from a probe that could not write at all (EACCES: see probe_verdict).
PROBE_SCRIPT = (
    "rm -rf ./* ./.[!.]*; "
    "mkdir -p .git/hooks && echo 'echo evil' > .git/hooks/pre-commit && chmod +x .git/hooks/pre-commit"
)
CellStatus = Literal["ran", "skipped", "error"]
BASELINE = "baseline"  # the mount column of the unsandboxed host cell (``--baseline``)


@dataclass(frozen=True)
class Plan:
    """What a comparison runs, every part validated before anything runs (``engine.make_plan``)."""

    argv: tuple[str, ...]
    workspace: Path
    backends: tuple[str, ...]
    mounts: tuple[str, ...]
    repeat: int
    profile: profiles.Profile
    timeout: float | None
    explicit_backends: bool
    baseline: bool = False  # also run the command on the host, unsandboxed, as the reference time


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
    bytes_untracked: int | None = None  # what mount.exclude kept out of the copy: the setup it saved


@dataclass
class Safety:
    survived: bool | None  # None: the probe could not run (``error``) or proved nothing (``inconclusive``)
    exit_code: int | None
    hook_planted: bool
    host_changes: dict[str, int]
    changes: dict[str, int] | None
    error: str = ""
    inconclusive: str = ""  # why an unchanged workspace says nothing about the strategy
    stderr_tail: str = ""  # the probe's own refusals, the evidence for the verdict


# Errno texts as coreutils and the shells print them, by what they say about the probe.
_READ_ONLY = "Read-only file system"
_REFUSALS = ("Permission denied", "Operation not permitted", _READ_ONLY, "Device or resource busy")
_MISSING = re.compile(r"not found|No such file or directory|cannot execute|Exec format error", re.IGNORECASE)


def probe_verdict(mount: str, exit_code: int | None, timed_out: bool, stderr: str, changed: bool) -> str:
    """Why the probe's outcome says nothing about ``mount``'s protection; ``""`` when it does.

    A probe that changed something (on the host or in the jail's own view) exercised the
    strategy: its verdict stands. One that changed nothing only proves ``ro``, and only when
    every refusal it met was the read-only mount's (EROFS); anything else (a permission the
    jail's user lacks, a missing tool, a timeout) is the reason the verdict is ``n/a``."""
    if changed:
        return ""
    if timed_out:
        return "probe timed out"
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    missing = [line for line in lines if _MISSING.search(line) and not _refusal(line)]
    if exit_code in (126, 127) or missing:
        return f"probe could not run: {(missing or lines or [f'exit {exit_code}'])[-1][:160]}"
    refusals = [found for line in lines if (found := _refusal(line))]
    if mount == "ro" and refusals and set(refusals) == {_READ_ONLY}:
        return ""
    other = [r for r in refusals if r != _READ_ONLY] or refusals
    if other:
        return f"probe could not write: {other[0]}"
    return f"probe changed nothing (exit {exit_code})"


def _refusal(line: str) -> str:
    return next((text for text in _REFUSALS if text in line), "")


# ------------------------------------------------------------------------------ a failure's reason

# A line that reads like an error, and lines that never are the reason (they trail errors: pip's
# "[notice] A new release", npm's pointer to its log, warnings, a tool's version banner).
_ERRORISH = re.compile(
    r"error|exception|traceback|fatal|fail|panic|ERR!|denied|not found|no such|cannot|can't|refused|abort|"
    r"timed out|killed|not permitted|segmentation",
    re.IGNORECASE,
)
_NOISE = re.compile(
    r"^\s*(\[notice\]|npm (warn|notice)\b|warn(ing)?\b|note\b|hint\b|info\b|debug\b)|\w*Warning:|"
    r"complete log of this run|_logs/\S*debug\S*\.log",
    re.IGNORECASE,
)
_BANNER = re.compile(r"^[\w .+/()-]{0,40}?\bv?\d+\.\d+(\.\d+)*[\w.+-]*\s*(\(.*\))?\s*$")


def relevant_line(text: str) -> str:
    """The line of a failing command's output that says why: the last error-like line that is
    not noise, else the last line that is neither noise nor a version banner, else the last."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    quiet = [line for line in lines if not _NOISE.search(line)]
    errors = [line for line in quiet if _ERRORISH.search(line)]
    plain = [line for line in quiet if not _BANNER.match(line)]
    return next(iter(errors[-1:] or plain[-1:] or lines[-1:]), "")[:200]


@dataclass
class Cell:
    backend: str
    mount: str
    status: CellStatus = "ran"
    reason: str = ""
    runs: list[Run] = field(default_factory=list)
    safety: Safety | None = None
    baseline: bool = False  # the unsandboxed host run every other cell is compared with

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
    def failed(self) -> bool:
        """Whether the command failed in any run here (non-zero exit or timeout): its times are a failure's."""
        return any(r.exit_code != 0 or r.timed_out for r in self.runs)

    @property
    def failure(self) -> str:
        """Why the command failed here: :func:`relevant_line` of a failing run's stderr, else stdout."""
        for run in self.runs:
            line = relevant_line(run.stderr_tail) or relevant_line(run.stdout_tail)
            if run.exit_code and line:
                return line
        return ""

    def spread(self, key: str) -> tuple[float, float] | None:
        """The smallest and largest of ``key`` over the runs; ``None`` with fewer than two values."""
        values = [float(v) for r in self.runs if (v := getattr(r, key)) is not None]
        return (min(values), max(values)) if len(values) > 1 else None

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
            "bytes_untracked": last.bytes_untracked if last else None,
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
            **({"baseline": True} if self.baseline else {}),
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

    @property
    def baseline(self) -> Cell | None:
        """The unsandboxed host cell (``--baseline``) when it ran, else None."""
        return next((c for c in self.ran if c.baseline), None)

    def vs_host(self, cell: Cell) -> float | None:
        """``cell``'s median wall time over the baseline's; None without a baseline or a time."""
        host = self.baseline.median("wall_ms") if self.baseline else None
        wall = cell.median("wall_ms") if cell.status == "ran" else None
        return round(wall / host, 3) if wall is not None and host else None

    def _cell_dict(self, cell: Cell) -> dict[str, Any]:
        ratio = {"vs_host": self.vs_host(cell)} if self.plan.baseline else {}
        return {**cell.to_dict(), **ratio}

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
            "network": _network(self.plan),
            "docker_image": self.plan.profile.docker.image,  # --image or the profile's; None: the default
            "mounts": list(self.plan.mounts),
            "host": _host(),
            "backends": self.backends,
            "safety_probe": PROBE_SCRIPT,
            "cells": [self._cell_dict(c) for c in self.cells],
        }


def exit_status(report: Report) -> int:
    """0: every cell ran or was skipped for a reason; 2: an explicitly named backend is unavailable;
    1: a cell failed to run (the sandbox refused or broke; a failing *command* is data, not this)."""
    if report.plan.explicit_backends and any(not b["available"] for b in report.backends.values()):
        return 2
    return 1 if any(c.status == "error" for c in report.cells) else 0


def _network(plan: Plan) -> dict[str, Any]:
    net = plan.profile.network
    return {"mode": net.mode, "allow": list(net.allow), "indexes": list(net.indexes)}


def _host() -> dict[str, Any]:
    return {
        "hostname": platform.node(),
        "kernel": platform.release(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "euid": os.geteuid(),
    }
