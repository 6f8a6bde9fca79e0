"""The ``microvm`` backend: each session's commands run in a QEMU microVM with a kernel of its own.

Namespaces, seccomp and Landlock all share the host's kernel: a bug in it is an escape. Here the
command's system calls go to a guest kernel (Debian's), and what reaches the host is what QEMU
emulates: two 9p exports (the image's root, read-only; the workspace, read-only in ``ro``), one
virtio-serial port to the agent, a serial console, and no network device. QEMU itself is in the
trusted base: it runs as the workspace's owner, never root, under ``-sandbox on``.

* :mod:`.assets`: the kernel, the initramfs and the root file system, built offline from Debian
  packages (``sandbox image build --microvm``).
* :mod:`.machine`: QEMU's command line, its start and its end; KVM or TCG.
* :mod:`.jail`: one VM per session, its agent (:mod:`sandbox._jailside.agent` behind
  :mod:`sandbox._jailside.vmboot`) driving the calls.

Mounts: ``ro`` and ``rw`` export the workspace; ``copy`` exports a private copy, which comes back
as a changeset and a guarded apply like every backend's; ``overlay`` is refused; the download cache
is one more export. Network: ``none`` (the guest has only its loopback) or ``allowlist``: the
guest's loopback port is relayed over a virtio-serial port of its own to the host's filtering
proxy (:mod:`.netside`, :mod:`sandbox._jailside.vmnet`), with the session CA's files (``[secrets]``,
request rules) a read-only export; no transparent mode. Limits: ``memory`` and ``pids`` are a
cgroup in the guest over the agent and its one call at a time, the VM a little larger; ``cpus``
its vCPUs; ``file_size``, ``nofile`` and ``cpu_time_s`` rlimits; ``/tmp`` and the home are tmpfs
of ``tmp_size``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import anyio.to_thread

from sandbox.backends import seal
from sandbox.backends.base import Backend, Jail
from sandbox.backends.microvm import assets, machine
from sandbox.downloads import JAIL_DIR as downloads_jail_dir
from sandbox.errors import BackendUnavailable, InvalidArgument
from sandbox.guarantees import Enforcement, Report

if TYPE_CHECKING:
    from collections.abc import Sequence

    from sandbox.network.egress import Egress
    from sandbox.profile import Profile
    from sandbox.snapshots import Snapshot

_GRANTED = (
    "fs-readonly-root",
    "fs-write-confined",
    "fs-hidden-home",
    "net-none",
    "net-confined",
    "tree-kill",
    "no-new-privs",
    "non-root",
    "no-caps",
    "env-scrubbed",
    "new-session",
    "fsize-limit",
    "tmp-size-limit",
    "pids-limit",
    "memory-limit",
    "cpu-limit",
    "kernel-isolated",
)
BUILD_HINT = "build it with: sandbox image build --microvm (as root: it runs debootstrap once)"


class MicroVMBackend(Backend):
    name = "microvm"
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
        seed: Snapshot | None = None,  # noqa: ARG002 - refused by open_jail (check_snapshots)
    ) -> Jail:
        from sandbox.backends.docker import own_dir
        from sandbox.backends.docker.config import exec_user, uid_gid
        from sandbox.backends.microvm.jail import MicroVMJail
        from sandbox.backends.microvm.netside import TrustFiles
        from sandbox.mounts import CopyTree

        strategy = profile.mount.strategy
        if strategy == "overlay":
            raise InvalidArgument("the microvm backend has no overlay mount; use copy", backend="microvm")
        if profile.network.mode not in ("none", "allowlist"):
            raise InvalidArgument(
                f"network {profile.network.mode!r}: a microVM has no network device; use 'none', or 'allowlist' "
                "(the host's filtering proxy)",
                backend="microvm",
            )
        if profile.network.transparent:
            raise InvalidArgument(
                "a transparent network needs a network device, and a microVM has none: its allowlist is the "
                "proxy's (the proxy variables); set network.transparent = false",
                backend="microvm",
            )
        exports = [(scratch, str(scratch), False)] if scratch is not None else []
        exports += [(Path(host), guest, True) for host, guest in shared]
        if downloads is not None:  # the project's download cache, read-write at the jail's own path
            exports.append((downloads, downloads_jail_dir, False))
        found = assets.find()
        if found is None:
            raise BackendUnavailable(f"the microVM's kernel and root file system are not built; {BUILD_HINT}")
        owner = uid_gid(exec_user(profile, workspace))
        sealed = await anyio.to_thread.run_sync(seal.for_profile, profile, workspace)
        tree = None
        parent = None
        trust = None
        try:
            if egress is not None:
                egress.resident = True  # the guest's relay listens at the proxy port for the VM's life
                trust = await anyio.to_thread.run_sync(TrustFiles, egress, owner)
                exports.append(trust.export())
            if strategy == "copy":
                exclude = (*profile.mount.exclude, *sealed.masked_paths)
                if os.geteuid() == 0 and owner[0] != 0 and machine.user_name(owner[0]) is None:
                    # QEMU then runs as that uid from its start (no -runas without a name), so the copy
                    # lives where it can walk: a directory of its own, not our private data directory.
                    parent = Path(tempfile.mkdtemp(prefix="sbx-vm-copy-"))
                    os.chown(parent, *owner)
                tree = await CopyTree.prepare(
                    workspace,
                    parent=parent,
                    exclude=exclude,
                    environment_cache=profile.mount.environment_cache == "project",
                    environment=profile.mount.environment,
                )
            if tree is not None and os.geteuid() == 0:
                await anyio.to_thread.run_sync(tree.hand_to, *owner)
            for area in (scratch, downloads):  # QEMU serves them as the command uid, as Docker's binds do
                if area is not None:
                    await anyio.to_thread.run_sync(own_dir, area, f"{owner[0]}:{owner[1]}")
            source = tree.root if tree else workspace
            jail = MicroVMJail(workspace, profile, source, tree, owner, found, sealed, exports, shared, egress, trust)
            await jail.start()
        except BaseException:
            if trust is not None:
                trust.remove()
            if tree is not None:
                await anyio.to_thread.run_sync(tree.remove)
            if parent is not None:
                shutil.rmtree(parent, ignore_errors=True)
            raise
        jail.leftover = parent
        return jail


def _report() -> Report:
    qemu = machine.qemu_path()
    found = assets.find()
    problem = None
    if qemu is None:
        problem = f"{machine.QEMU} is not installed (Debian: apt-get install qemu-system-x86)"
    elif found is None:
        problem = f"the microVM's kernel and root file system are not built; {BUILD_HINT}"
    report = Report("microvm", problem is None, problem or "")
    kind, why = machine.accel()
    report.details.update(accel=kind, accel_reason=why, qemu=qemu, kernel=found.version if found else None)
    report.notes += [
        "a guest kernel of its own (Debian's) under QEMU: the command's system calls never reach the host's "
        "kernel; QEMU (as the workspace's owner, under -sandbox on) is in the trusted base",
        "no network device: network 'none', or 'allowlist' through the host's filtering proxy over a "
        "virtio-serial port of its own (the proxy variables, brokered secrets; no transparent mode); ro, rw and copy "
        "mounts over 9p",
    ]
    if kind == "tcg":
        report.advice.append(f"the guest runs emulated (TCG), tens of times slower than with KVM: {why}")
    for name in _GRANTED:
        report.grant(name, problem is None, problem or "")
    report.grant("net-allowlist", problem is None, problem or "")
    report.grant("net-transparent", False, "a microVM has no network device: its allowlist is the proxy's alone")
    report.grant("overlay", False, "the microvm backend offers ro, rw and copy mounts, not overlay")
    report.grant("seccomp", False, "no seccomp filter in the guest: its kernel is the boundary, not the host's")
    report.limits = {
        "memory": Enforcement("a memory cgroup in the guest", "call"),
        "cpus": Enforcement("the VM's vCPUs", "call"),
        "pids": Enforcement("a pids cgroup in the guest", "call"),
        "file_size": Enforcement("RLIMIT_FSIZE", "process"),
        "nofile": Enforcement("RLIMIT_NOFILE", "process"),
        "tmp_size": Enforcement("tmpfs size in the guest", "call"),
        "cpu_time_s": Enforcement("RLIMIT_CPU", "process"),
    }
    return report


backend_class = MicroVMBackend
