"""No isolation: the command runs on the host, as the caller, in the workspace itself.

For trusted use and as the baseline benchmarks compare against; ``auto`` never picks it. It
still scrubs the environment and, where this host has cgroups, tracks and limits the call's
processes so the tree kill holds; the probe says plainly what it does not guarantee.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from sandbox.backends import cgroups, confine, local
from sandbox.backends.base import Backend
from sandbox.backends.child import Child
from sandbox.backends.environment import base_env
from sandbox.errors import GuaranteeUnavailable
from sandbox.guarantees import Report

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from pathlib import Path

    from sandbox.network.egress import Egress
    from sandbox.profile import Profile
    from sandbox.snapshots import Snapshot


# The shell reads one line from stdin (byte by byte: it never reads past the newline), so the
# command starts only once we have put it in its cgroup; what follows is the command's stdin.
_HOLD = 'read -r _; exec "$@"'


class HostJail(local.LocalJail):
    backend = "host"
    host_paths_shown = ("/",)
    python = sys.executable  # no jail: our programs run under the executor's own interpreter

    async def _launch(
        self,
        argv: Sequence[str],
        env: Mapping[str, str] | None,
        cwd: str | None,
        group: cgroups.CallCgroup | None,
        *,
        stdin: bool,
    ) -> local.LocalProcess:
        with confine.starting("cannot start the command"):
            proc = Child(
                ["/bin/sh", "-c", _HOLD, "sandbox-host", *argv],
                stdin=True,
                new_session=True,
                cwd=cwd or str(self.workspace),
                env=base_env(self.profile, env) | {"HOME": str(self.workspace)},
            )
        with self._releasing(proc, group, "host", stdin=stdin) as child:
            return child


class HostBackend(Backend):
    name = "host"

    def _probe(self) -> Report:
        return _report()

    async def _open(
        self,
        workspace: Path,
        profile: Profile,
        *,
        scratch: Path | None,  # noqa: ARG002 - shown where it is, as every host path
        egress: Egress | None,  # noqa: ARG002 - the host shares our network: check refuses allowlist
        shared: Sequence[tuple[str, str]] = (),
        downloads: Path | None = None,  # noqa: ARG002 - refused by open_jail (binds_downloads)
        seed: Snapshot | None = None,  # noqa: ARG002 - refused by open_jail (check_snapshots)
    ) -> HostJail:
        # ``scratch`` needs no binding: the host shows every path where it is, scratch included.
        if shared:
            raise GuaranteeUnavailable(
                f"the host backend cannot show {shared[0][0]} at {shared[0][1]} (no mount namespace); "
                "use a real backend (bwrap, docker) for plugin tools",
                backend="host",
            )
        if profile.mount.strategy != "rw":
            # Without a mount namespace a copy could not appear at the workspace's own path, and
            # tools given workspace paths would write the real workspace: refuse, do not pretend.
            raise GuaranteeUnavailable(
                f"the host backend cannot provide mount {profile.mount.strategy!r}, only rw; use a real "
                "backend (bwrap, docker) for ro, copy or overlay",
                backend="host",
            )
        return HostJail(workspace, profile, None)


def _report() -> Report:
    report = Report("host", True)
    report.details["warning"] = "no isolation: the command sees and can change everything the caller can"
    none = "the host backend does not isolate"
    for name in (
        "fs-readonly-root",
        "fs-write-confined",
        "fs-hidden-home",
        "net-none",
        "net-confined",
        "net-allowlist",
        "net-transparent",
        "no-new-privs",
        "non-root",
        "no-caps",
        "new-session",
        "seccomp",
        "overlay",
        "tmp-size-limit",
    ):
        report.grant(name, False, none)
    report.grant("env-scrubbed", True)
    report.grant("cpu-limit", True)
    report.grant("fsize-limit", True)
    pids = cgroups.hierarchies()["pids"]
    report.grant(
        "tree-kill",
        isinstance(pids, cgroups.Hierarchy),
        "without a pids cgroup, double-forked processes can escape the kill" if isinstance(pids, str) else "",
    )
    local.report_limits(report, "host", None)
    return report


backend_class = HostBackend
