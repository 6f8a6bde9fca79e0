"""No isolation: the command runs on the host, as the caller, in the workspace itself.

For trusted use and as the baseline benchmarks compare against; ``auto`` never picks it. It
still scrubs the environment and, where this host has cgroups, tracks and limits the call's
processes so the tree kill holds; the probe says plainly what it does not guarantee.
"""

from __future__ import annotations

import os
from functools import cache
from typing import TYPE_CHECKING

from sandbox.backends import cgroups, local
from sandbox.backends.base import Backend
from sandbox.backends.child import Child
from sandbox.backends.environment import base_env
from sandbox.errors import BackendUnavailable, GuaranteeUnavailable, map_errors
from sandbox.guarantees import Report
from sandbox.mounts import CopyTree, check_workspace

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from pathlib import Path

    from sandbox.profile import Profile



class HostJail(local.LocalJail):
    backend = "host"

    @property
    def cwd(self) -> Path:
        return self.tree.root if self.tree else self.workspace

    async def spawn(
        self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: str | None = None,
        stdin: bytes | None = None,
    ) -> local.LocalProcess:
        self._check_spawn(argv)
        group = self._pool.take()
        hold_r, hold_w = os.pipe()
        # The child waits on the pipe until it is in its cgroup, then becomes the command.
        hold = f'read -r _ <&{hold_r}; exec {hold_r}<&-; exec "$@"'
        try:
            with map_errors("cannot start the command", BackendUnavailable):
                proc = Child(
                    ["/bin/sh", "-c", hold, "sandbox-host", *argv], pass_fds=(hold_r,),
                    cwd=cwd or str(self.cwd), env=base_env(self.profile, env) | {"HOME": str(self.cwd)},
                    new_session=True, stdin=stdin is not None,
                )
            child = local.LocalProcess(proc, proc.pid, group, self._released, kernel_reaps=False)
            local.confine(proc.pid, self.profile, group)
            os.write(hold_w, b"go\n")
        except BaseException:
            if group:
                self._pool.give_back(group)
            raise
        finally:
            os.close(hold_r)
            os.close(hold_w)
        child.stdin_data = stdin
        self._live.add(child)
        return child


class HostBackend(Backend):
    name = "host"

    def probe(self) -> Report:
        return probe()

    async def open_jail(self, workspace: Path, profile: Profile, *, scratch: Path | None = None) -> HostJail:
        self.check(profile)
        if profile.mount.strategy not in ("rw", "copy"):
            raise GuaranteeUnavailable(
                f"the host backend cannot enforce mount {profile.mount.strategy!r}; use rw or copy, "
                "or a real backend (bwrap, docker)", backend="host")
        ws = check_workspace(workspace)
        tree = await CopyTree.prepare(ws) if profile.mount.strategy == "copy" else None
        return HostJail(ws, profile, tree)


@cache
def probe() -> Report:
    report = Report("host", True)
    report.details["warning"] = "no isolation: the command sees and can change everything the caller can"
    none = "the host backend does not isolate"
    for name in ("fs-readonly-root", "fs-write-confined", "fs-hidden-home", "net-none", "no-new-privs",
                 "non-root", "no-caps", "new-session", "seccomp", "overlay", "tmp-size-limit"):
        report.grant(name, False, none)
    report.grant("env-scrubbed", True)
    report.grant("cpu-limit", True)
    report.grant("fsize-limit", True)
    pids = cgroups.hierarchies()["pids"]
    report.grant("tree-kill", isinstance(pids, cgroups.Hierarchy),
                 "without a pids cgroup, double-forked processes can escape the kill" if isinstance(pids, str) else "")
    for ctrl, name in (("memory", "memory-limit"), ("pids", "pids-limit")):
        where = cgroups.hierarchies()[ctrl]
        report.grant(name, isinstance(where, cgroups.Hierarchy), where if isinstance(where, str) else "")
    return report


backend_class = HostBackend
