"""The bubblewrap backend: the embedded default, no daemon.

It opens a jail per session: a warm one (:mod:`~sandbox.backends.bwrap_warm`, the default: one
pid namespace and an agent for the session, each call still in its own cgroup) or one whose
every call is a fresh bwrap (:mod:`~sandbox.backends.bwrap_jail`, ``[bwrap] lifecycle =
"call"``); both start bwrap through :mod:`~sandbox.backends.bwrap_start`. ``check`` runs one
real jail (its verdict cached, :func:`_smoke_verdict`) and reports what it enforces here.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import anyio

from sandbox.backends import bwrap_argv, cgroups, local, seccomp
from sandbox.backends.base import Backend, seed_tree
from sandbox.backends.bwrap_argv import bwrap_path, jail_args
from sandbox.backends.bwrap_jail import BwrapJail
from sandbox.backends.bwrap_warm import WarmBwrapJail
from sandbox.backends.environment import host_files
from sandbox.guarantees import Report
from sandbox.mounts import CopyTree, OverlayTree, overlay_support
from sandbox.threads import off_loop

if TYPE_CHECKING:
    from collections.abc import Sequence

    from sandbox.network.egress import Egress
    from sandbox.profile import Profile
    from sandbox.snapshots import Snapshot


class BwrapBackend(Backend):
    name = "bwrap"
    snapshots = True
    binds_downloads = True

    def _probe(self) -> Report:
        return _report()

    async def _open(
        self,
        workspace: Path,
        profile: Profile,
        *,
        scratch: Path | None,
        egress: Egress | None,
        shared: Sequence[tuple[str, str]] = (),
        downloads: Path | None = None,
        seed: Snapshot | None = None,
    ) -> BwrapJail:
        host_files(profile)  # a file that became a secret is refused before a copy exists
        tree: CopyTree | None = None
        source = workspace
        sealed = await off_loop(bwrap_argv.find_sealed, profile, workspace)
        if profile.mount.strategy in ("copy", "overlay"):
            kind = OverlayTree if profile.mount.strategy == "overlay" else CopyTree
            # A copy leaves the masked secrets out: the jail masks their (empty) mount points.
            exclude = (*profile.mount.exclude, *sealed.masked_paths)
            cache = profile.mount.environment_cache == "project"
            tree = await kind.prepare(
                workspace, exclude=exclude, environment_cache=cache, environment=profile.mount.environment
            )
            source = tree.root
            try:
                if profile.mount.strategy == "copy" and os.geteuid() == 0:
                    # The jail writes with our uid and no capabilities: the copy must be ours to write.
                    await off_loop(tree.hand_to, os.geteuid(), os.getegid())
                await seed_tree(tree, seed, self.name)  # before the jail: its masks cover what the seed put
            except BaseException:
                with anyio.CancelScope(shield=True):
                    await off_loop(tree.remove)
                raise
        args = (workspace, profile, source, tree, scratch, egress.socket_dir if egress else None, sealed, shared)
        if profile.bwrap.lifecycle == "call":
            return BwrapJail(*args, downloads=downloads)
        jail = WarmBwrapJail(*args, downloads=downloads)
        jail.egress = egress  # the transparent mode's veth goes to the jail at its start
        try:
            await jail.start()
        except BaseException:
            jail.egress = None  # open_jail closes it
            await jail.aclose()
            raise
        return jail


_ALWAYS = (
    "fs-readonly-root",
    "fs-write-confined",
    "fs-hidden-home",
    "net-none",
    "net-confined",
    "net-allowlist",
    "tree-kill",
    "no-new-privs",
    "non-root",
    "no-caps",
    "env-scrubbed",
    "new-session",
    "cpu-limit",
    "fsize-limit",
    "tmp-size-limit",
)


def _smoke() -> str | None:
    """Run one real jail; ``None`` when it confined as promised, else why not."""
    from sandbox.profile import Profile

    empty = Path(bwrap_argv.empty_dir())
    cmd = [
        *bwrap_argv.command_prefix(Profile()),
        *jail_args(Profile(), empty, empty),
        "--clearenv",
        "--",
        "/bin/sh",
        "-c",
        "grep -E '^(NoNewPrivs|CapEff|Uid)' /proc/self/status",
    ]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bwrap did not run: {exc}"
    if out.returncode != 0:
        return f"bwrap cannot create a jail here: {out.stderr.strip() or out.returncode}"
    fields = dict(line.split(":", 1) for line in out.stdout.splitlines())
    if fields.get("NoNewPrivs", "").strip() != "1" or int(fields.get("CapEff", "1"), 16) != 0:
        return f"the jail kept privileges: {fields}"
    return None


def _report() -> Report:
    """What bwrap enforces here; a failure to fork is marked ``transient``, so it is asked again."""
    path = bwrap_path()
    if path is None:
        return Report("bwrap", False, "bubblewrap is not installed (apt-get install bubblewrap)")
    problem, version = _smoke_verdict(path)
    report = Report("bwrap", problem is None, problem or "")
    if problem and "Errno 11]" in problem:
        report.details["transient"] = True
    report.details["version"] = version
    for name in _ALWAYS:
        report.grant(name, problem is None, problem or "")
    local.report_limits(report, "bwrap", problem)
    report.details["session-tree-kill"] = _warm_tree_kill()
    no_filter = problem or seccomp.availability()
    report.grant("seccomp", no_filter is None, no_filter or "")
    from sandbox.network import netns

    transparent = problem or netns.available()
    report.grant("net-transparent", transparent is None, transparent or "")
    overlay = overlay_support()
    report.grant("overlay", overlay is None and problem is None, overlay or problem or "")
    return report


def _warm_tree_kill() -> str:
    """How a warm jail (``[bwrap] lifecycle = "session"``) kills a call's tree on this host."""
    pids = cgroups.hierarchies()["pids"]
    if isinstance(pids, cgroups.Hierarchy):
        return (
            f"the agent's sweep, backed by each call's own cgroup ({pids.mechanism}, joined before the command "
            "runs) and by the jail's pid namespace when the agent does not answer"
        )
    return (
        "the agent's sweep (kill -1 in the jail's pid namespace); when the agent does not answer, the whole "
        f"pid namespace: no per-call cgroup here ({pids})"
    )


def _smoke_verdict(path: str) -> tuple[str | None, str]:
    """The smoke test's verdict and bwrap's version, from the data directory's cache when it is current.

    Every process used to run a real jail (and ``bwrap --version``) before its first call: a
    third of a short ``sandbox run``. A passed smoke test is kept, keyed by what decides it:
    this package's version, the bwrap binary (inode, size, mtime), the kernel and boot, our
    euid and the user-namespace sysctls. A stale "available" can only make bwrap itself fail at
    the next call, which is BACKEND_UNAVAILABLE: it never runs anything unconfined. Failures are
    never cached, so a host that is fixed is seen at once.
    """
    kept = bwrap_argv.passed_smoke(path)
    if kept is not None:
        return None, kept
    problem = _smoke()
    try:
        version = subprocess.run([path, "--version"], capture_output=True, text=True, check=False).stdout.strip()
    except OSError as exc:
        version = f"unknown ({exc.strerror})"
    if problem is None:
        bwrap_argv.remember_smoke(path, version)
    return problem, version


backend_class = BwrapBackend
