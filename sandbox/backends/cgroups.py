"""Per-call cgroups for memory, pids and CPU limits, on cgroup v2 or v1.

The host decides which hierarchy holds which controller: a controller listed in the unified
(v2) hierarchy's ``cgroup.controllers`` is used there, otherwise its v1 mount is used. A call's
cgroup is created beneath the executor's own cgroup (v1) or beneath ``/sandbox`` in the v2
root, so delegated hierarchies keep working. Everything here is synchronous and quick (a few
small writes); callers in async code run it inline because it never blocks on I/O of size.
"""

from __future__ import annotations

import contextlib
import errno
import os
import uuid
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
CONTROLLERS = ("memory", "pids", "cpu")


@dataclass(frozen=True)
class Hierarchy:
    controller: str
    version: int
    base: Path  # where per-call cgroups are created


def _mounts() -> list[tuple[str, str, str]]:
    rows = []
    with open("/proc/self/mounts", encoding="utf-8") as fh:
        for line in fh:
            _dev, where, fstype, opts, *_ = line.split()
            rows.append((where, fstype, opts))
    return rows


def _own_paths() -> dict[str, str]:
    """Controller (or "" for v2) -> this process's cgroup path."""
    paths: dict[str, str] = {}
    with open("/proc/self/cgroup", encoding="utf-8") as fh:
        for line in fh:
            _num, ctrls, path = line.rstrip("\n").split(":", 2)
            for ctrl in ctrls.split(",") if ctrls else [""]:
                paths[ctrl] = path
    return paths


def _v2_base(mount: Path, controller: str) -> Path | None:
    available = (mount / "cgroup.controllers").read_text().split()
    if controller not in available:
        return None
    base = mount / "sandbox"
    try:
        base.mkdir(exist_ok=True)
        for level in (mount, base):
            (level / "cgroup.subtree_control").write_text(f"+{controller}")
    except OSError:
        return None
    return base


@cache
def hierarchies() -> dict[str, Hierarchy | str]:
    """Controller -> where to create cgroups for it, or the reason it cannot be used."""
    found: dict[str, Hierarchy | str] = dict.fromkeys(CONTROLLERS, "no cgroup hierarchy has this controller")
    own = _own_paths()
    for where, fstype, opts in _mounts():
        mount = Path(where)
        for ctrl in CONTROLLERS:
            if isinstance(found[ctrl], Hierarchy):
                continue
            if fstype == "cgroup2":
                with contextlib.suppress(OSError):
                    base = _v2_base(mount, ctrl)
                    if base is not None:
                        found[ctrl] = Hierarchy(ctrl, 2, base)
            elif fstype == "cgroup" and ctrl in opts.split(","):
                base = mount / own.get(ctrl, "/").lstrip("/")
                if os.access(base, os.W_OK):
                    found[ctrl] = Hierarchy(ctrl, 1, base)
                else:
                    found[ctrl] = f"cgroup v1 {ctrl} hierarchy at {base} is not writable (run as root or delegate it)"
    return found


@dataclass
class Limits:
    memory: int | None = None
    pids: int | None = None
    cpus: float | None = None


_V2_FILES = {"memory": "memory.max", "pids": "pids.max"}
_V1_FILES = {"memory": "memory.limit_in_bytes", "pids": "pids.max"}


@dataclass
class CallCgroup:
    """The cgroups (one per controller in use) that hold one call's processes.

    Reused across calls of a jail (see ``sandbox.backends.local.CgroupPool``): the first attach
    to a fresh v1 memory cgroup costs milliseconds, later ones tens of microseconds.
    """

    paths: list[Path] = field(default_factory=list)
    oom_baseline: int = 0

    @classmethod
    def create(cls, limits: Limits) -> CallCgroup:
        name = f"call-{uuid.uuid4().hex[:12]}"
        group = cls()
        wanted = {"memory": limits.memory, "pids": limits.pids, "cpu": limits.cpus}
        try:
            for ctrl, value in wanted.items():
                if value is None:
                    continue
                where = hierarchies()[ctrl]
                if not isinstance(where, Hierarchy):
                    raise OSError(errno.ENOTSUP, where)
                path = where.base / name
                path.mkdir()
                group.paths.append(path)
                _set_limit(where, path, ctrl, value)
        except BaseException:
            group.remove()
            raise
        return group

    def add(self, pid: int) -> None:
        for path in self.paths:
            (path / "cgroup.procs").write_text(str(pid))

    def pids(self) -> set[int]:
        found: set[int] = set()
        for path in self.paths:
            with contextlib.suppress(OSError):
                found.update(int(p) for p in (path / "cgroup.procs").read_text().split())
        return found

    def peak_memory(self) -> int | None:
        for path in self.paths:
            for name in ("memory.peak", "memory.max_usage_in_bytes"):
                with contextlib.suppress(OSError, ValueError):
                    return int((path / name).read_text())
        return None

    def oom_kills(self) -> int:
        for path in self.paths:
            for name in ("memory.events", "memory.oom_control"):
                with contextlib.suppress(OSError):
                    for line in (path / name).read_text().splitlines():
                        key, _, value = line.partition(" ")
                        if key == "oom_kill":
                            return int(value)
        return 0

    def oom_killed(self) -> bool:
        return self.oom_kills() > self.oom_baseline

    def rearm(self) -> None:
        """Start a new call's accounting in a reused cgroup."""
        self.oom_baseline = self.oom_kills()
        for path in self.paths:
            with contextlib.suppress(OSError):
                (path / "memory.max_usage_in_bytes").write_text("0")

    def remove(self) -> None:
        for path in self.paths:
            with contextlib.suppress(OSError):
                path.rmdir()
        self.paths.clear()


def _set_limit(where: Hierarchy, path: Path, ctrl: str, value: float) -> None:
    if ctrl == "cpu":
        period = 100_000
        quota = max(1000, int(value * period))
        if where.version == 2:
            (path / "cpu.max").write_text(f"{quota} {period}")
        else:
            (path / "cpu.cfs_period_us").write_text(str(period))
            (path / "cpu.cfs_quota_us").write_text(str(quota))
        return
    files = _V2_FILES if where.version == 2 else _V1_FILES
    (path / files[ctrl]).write_text(str(int(value)))
    if ctrl == "memory":
        # Swap would let a memory bomb outlive the limit; cap memory+swap at the same value.
        swap = path / ("memory.swap.max" if where.version == 2 else "memory.memsw.limit_in_bytes")
        with contextlib.suppress(OSError):
            swap.write_text("0" if where.version == 2 else str(int(value)))
