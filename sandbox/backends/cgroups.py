"""Per-call cgroups for memory, pids and CPU limits, on cgroup v2 or v1, and which ones we may use.

Detection reads the mount table and our own cgroup (:class:`HostView`) and decides, controller by
controller, where per-call cgroups go (:func:`detect`):

- cgroup v1: beneath our own cgroup of that controller's hierarchy, when we may write there (root,
  or a v1 directory delegated to our uid);
- cgroup v2 as root: beneath ``/sandbox`` in the hierarchy's root;
- cgroup v2 delegated to our uid (``systemd-run --user --scope -p Delegate=yes``; systemd chowns
  the scope's directory, ``cgroup.procs`` and ``cgroup.subtree_control`` to the user): v2 allows
  no processes in a cgroup that hands controllers to its children, so every process of our cgroup
  first moves into a leaf child (:data:`LEAF`), the controllers are enabled in the delegated
  cgroup's ``subtree_control``, and per-call cgroups are created beside the leaf.

A call's cgroups are named ``call-<pid>-<starttime>-<id>`` after the executor that made them, so
``sandbox.leftovers`` can tell the ones of a dead executor from a live one's. Everything here is
synchronous and quick (a few small writes); callers in async code run it inline.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
from functools import cache
from pathlib import Path
from typing import NamedTuple

CGROUP_ROOT = Path("/sys/fs/cgroup")
CONTROLLERS = ("memory", "pids", "cpu")
LEAF = "sandbox-executor"
DELEGATE_HINT = "systemd-run --user --scope -p Delegate=yes sandbox ..."


class Hierarchy(NamedTuple):
    controller: str
    version: int
    base: Path  # where per-call cgroups are created
    delegated: bool = False  # a subtree handed to our (non-root) uid

    @property
    def mechanism(self) -> str:
        return f"cgroup v{self.version}" + (" (delegated)" if self.delegated else "")


class HostView(NamedTuple):
    """What detection reads: mounts (where, fstype, options), our cgroup paths, our uid."""

    mounts: tuple[tuple[str, str, str], ...]
    own: dict[str, str]  # controller (or "" for v2) -> our cgroup path in that hierarchy
    euid: int
    pid: int

    @classmethod
    def current(cls) -> HostView:
        return cls(tuple(_mounts()), _own_paths(), os.geteuid(), os.getpid())


def _mounts() -> list[tuple[str, str, str]]:
    rows = []
    with open("/proc/self/mounts", encoding="utf-8") as fh:
        for line in fh:
            _dev, where, fstype, opts, *_ = line.split()
            rows.append((where, fstype, opts))
    return rows


def _own_paths() -> dict[str, str]:
    paths: dict[str, str] = {}
    with open("/proc/self/cgroup", encoding="utf-8") as fh:
        for line in fh:
            _num, ctrls, path = line.rstrip("\n").split(":", 2)
            for ctrl in ctrls.split(",") if ctrls else [""]:
                paths[ctrl] = path
    return paths


def _ours(path: Path, euid: int) -> bool:
    """Whether we may create cgroups in ``path``: root may; another uid only where it was delegated."""
    if euid == 0:
        return os.access(path, os.W_OK)
    try:
        return all(p.stat().st_uid == euid for p in (path, path / "cgroup.procs"))
    except OSError:
        return False


def _v1(mount: Path, ctrl: str, view: HostView) -> Hierarchy | str:
    base = mount / view.own.get(ctrl, "/").lstrip("/")
    if _ours(base, view.euid):
        return Hierarchy(ctrl, 1, base, delegated=view.euid != 0)
    advice = (
        "a container's cgroups are read-only to it: give it a writable cgroup, or run as an ordinary user"
        if view.euid == 0
        else "run as root, or give this user a delegated cgroup"
    )
    return f"cgroup v1 {ctrl} hierarchy at {base} is not writable by uid {view.euid} ({advice})"


def _v2_root_base(mount: Path, wanted: list[str]) -> tuple[Path, list[str]] | None:
    """As root: ``/sandbox`` in the hierarchy's root, with ``wanted`` enabled down to it."""
    base = mount / "sandbox"
    try:
        base.mkdir(exist_ok=True)
        for level in (mount, base):
            for ctrl in wanted:
                (level / "cgroup.subtree_control").write_text(f"+{ctrl}")
    except OSError:
        return None
    return base, wanted


def _v2_delegated_base(own: Path, view: HostView) -> tuple[Path, list[str]] | str:
    """Our own (delegated) cgroup, emptied into a leaf, with its controllers handed to children."""
    top = own.parent if own.name == LEAF else own
    if not _ours(top, view.euid) or not _ours_file(top / "cgroup.subtree_control", view.euid):
        return (
            f"cgroup v2: our cgroup {top} is not delegated to uid {view.euid}; for per-call cgroups "
            f"run under a delegated systemd scope: {DELEGATE_HINT}"
        )
    try:
        available = (top / "cgroup.controllers").read_text().split()
        if own.name != LEAF:
            leaf = top / LEAF
            leaf.mkdir(exist_ok=True)
            for pid in (top / "cgroup.procs").read_text().split():
                with contextlib.suppress(ProcessLookupError):  # it exited meanwhile
                    (leaf / "cgroup.procs").write_text(pid)
    except OSError as exc:
        return f"cgroup v2: cannot move our processes into a leaf of {top}: {exc.strerror or exc}"
    enabled = []
    for ctrl in CONTROLLERS:
        if ctrl in available:
            with contextlib.suppress(OSError):
                (top / "cgroup.subtree_control").write_text(f"+{ctrl}")
                enabled.append(ctrl)
    return top, enabled


def _ours_file(path: Path, euid: int) -> bool:
    if euid == 0:
        return os.access(path, os.W_OK)
    try:
        return path.stat().st_uid == euid
    except OSError:
        return False


def _v2(mount: Path, view: HostView) -> dict[str, Hierarchy | str]:
    try:
        wanted = [c for c in CONTROLLERS if c in (mount / "cgroup.controllers").read_text().split()]
    except OSError:
        return {}
    if not wanted:
        return {}  # a hybrid host: every controller is bound to a v1 hierarchy
    own = mount / view.own.get("", "/").lstrip("/")
    # Root may use the hierarchy's root; inside a cgroup namespace that root is a cgroup with
    # processes, where v2 refuses to enable controllers: then root, too, uses its own cgroup.
    placed = _v2_root_base(mount, wanted) if view.euid == 0 else None
    where = placed if placed is not None else _v2_delegated_base(own, view)
    if isinstance(where, str):
        return dict.fromkeys(wanted, where)
    base, enabled = where
    return {
        ctrl: Hierarchy(ctrl, 2, base, delegated=view.euid != 0)
        if ctrl in enabled
        else f"cgroup v2: cannot enable the {ctrl} controller in {base}"
        for ctrl in wanted
    }


def detect(view: HostView) -> dict[str, Hierarchy | str]:
    """Controller -> where to create per-call cgroups for it, or the reason it cannot be used."""
    found: dict[str, Hierarchy | str] = {
        ctrl: f"no cgroup hierarchy on this host has the {ctrl} controller" for ctrl in CONTROLLERS
    }
    for where, fstype, opts in view.mounts:
        if fstype == "cgroup2":
            candidates = _v2(Path(where), view)
        elif fstype == "cgroup":
            candidates = {c: _v1(Path(where), c, view) for c in CONTROLLERS if c in opts.split(",")}
        else:
            continue
        for ctrl, value in candidates.items():
            if not isinstance(found[ctrl], Hierarchy):
                found[ctrl] = value
    return found


@cache
def hierarchies() -> dict[str, Hierarchy | str]:
    """:func:`detect` for this process (once: a delegated v2 subtree is set up on first use)."""
    try:
        return detect(HostView.current())
    except OSError as exc:
        return dict.fromkeys(CONTROLLERS, f"cannot read this process's cgroups: {exc.strerror or exc}")


class Limits(NamedTuple):
    memory: int | None = None
    pids: int | None = None
    cpus: float | None = None


_V2_FILES = {"memory": "memory.max", "pids": "pids.max"}
_V1_FILES = {"memory": "memory.limit_in_bytes", "pids": "pids.max"}


class CallCgroup:
    """The cgroups (one per controller in use) that hold one call's processes.

    Reused across calls of a jail (see ``sandbox.backends.local.CgroupPool``): the first attach
    to a fresh v1 memory cgroup costs milliseconds, later ones tens of microseconds.
    """

    def __init__(self, paths: list[Path] | None = None) -> None:
        self.paths: list[Path] = paths or []
        self.oom_baseline = 0

    def __repr__(self) -> str:
        return f"CallCgroup({[str(p) for p in self.paths]})"

    @classmethod
    def create(cls, limits: Limits, owner: str) -> CallCgroup:
        """``owner`` is the executor's ``<pid>-<starttime>`` (see ``sandbox.leftovers``)."""
        name = f"call-{owner}-{os.urandom(4).hex()}"
        group = cls()
        wanted = {"memory": limits.memory, "pids": limits.pids, "cpu": limits.cpus}
        with contextlib.ExitStack() as cleanup_on_fail:
            cleanup_on_fail.callback(group.try_remove)
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
            cleanup_on_fail.pop_all()
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

    def kill(self) -> None:
        """SIGKILL every member (v2: ``cgroup.kill``, which also catches processes forking meanwhile;
        v1 has no such file)."""
        for path in self.paths:
            with contextlib.suppress(OSError):
                (path / "cgroup.kill").write_text("1")
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

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

    def try_remove(self) -> bool:
        """Remove the cgroups that are empty; ``True`` once none is left.

        ``rmdir`` fails with EBUSY while a member is still exiting, and a task leaves its cgroup
        only after its last context switch, a moment after its parent saw it exit: callers retry
        (``sandbox.backends.local.dispose``) rather than give up on the first EBUSY.
        """
        for path in list(self.paths):
            try:
                path.rmdir()
            except FileNotFoundError:
                pass
            except OSError:
                continue
            self.paths.remove(path)
        return not self.paths


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
