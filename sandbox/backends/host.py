"""No isolation: the command runs on the host, as the caller, in the workspace itself.

For trusted use and as the baseline benchmarks compare against; ``auto`` never picks it. It
still scrubs the environment and, where this host has cgroups, tracks and limits the call's
processes so the tree kill holds; the probe says plainly what it does not guarantee.
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING

from sandbox.backends import cgroups, confine, local
from sandbox.backends.base import Backend
from sandbox.backends.child import Child
from sandbox.backends.environment import base_env
from sandbox.calls import check_workspace
from sandbox.errors import GuaranteeUnavailable
from sandbox.guarantees import Report

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from pathlib import Path

    from sandbox.backends.base import Stdin
    from sandbox.profile import Profile


# The shell reads one line from stdin (byte by byte: it never reads past the newline), so the
# command starts only once we have put it in its cgroup; what follows is the command's stdin.
_HOLD = 'read -r _; exec "$@"'


class HostJail(local.LocalJail):
    backend = "host"
    host_paths_shown = ("/",)

    async def spawn(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: Stdin = None,
    ) -> local.LocalProcess:
        self._check_spawn(argv)
        group = self._pool.take()
        try:
            with confine.starting("cannot start the command"):
                proc = Child(
                    ["/bin/sh", "-c", _HOLD, "sandbox-host", *argv],
                    stdin=True,
                    new_session=True,
                    cwd=cwd or str(self.workspace),
                    env=base_env(self.profile, env) | {"HOME": str(self.workspace)},
                )
            try:
                child = local.LocalProcess(proc, proc.pid, group, self._released, kernel_reaps=False)
                confine.confine(proc.pid, self.profile, group, "host")
                proc.release_hold(b"go\n", keep_open=stdin is not None)
            except BaseException:
                proc.kill()  # still held in `read`: it has started nothing
                proc.popen.wait()
                proc.close()
                raise
        except BaseException:
            if group:
                self._pool.give_back(group)
            raise
        child.stdin_data = stdin
        self._live.add(child)
        return child


class HostBackend(Backend):
    name = "host"

    def probe(self) -> Report:
        return probe()

    async def open_jail(self, workspace: Path, profile: Profile, *, scratch: Path | None = None) -> HostJail:
        self.check(profile)
        if profile.mount.strategy != "rw":
            # Without a mount namespace a copy could not appear at the workspace's own path, and
            # tools given workspace paths would write the real workspace: refuse, do not pretend.
            raise GuaranteeUnavailable(
                f"the host backend cannot provide mount {profile.mount.strategy!r}, only rw; use a real "
                "backend (bwrap, docker) for ro, copy or overlay",
                backend="host",
            )
        return HostJail(check_workspace(workspace), profile, None)


@cache
def probe() -> Report:
    report = Report("host", True)
    report.details["warning"] = "no isolation: the command sees and can change everything the caller can"
    none = "the host backend does not isolate"
    for name in (
        "fs-readonly-root",
        "fs-write-confined",
        "fs-hidden-home",
        "net-none",
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
