"""The Docker jail: a container per session (warm) or per call, through the docker SDK only.

Two process models, one module each, behind the common :class:`~.jail.DockerJail`:

* :mod:`.warm` (``lifecycle = "session"``): one container for the session, whose only process
  is the stdlib agent of :mod:`sandbox._jailside.agent`, PID 1 and the command uid. A call is a
  request over a unix socket of ours bound into the container, with the call's pipe ends passed
  along (:mod:`.links`; the attach stream is the fallback), and a fork in the container, no
  ``docker exec``; the agent sweeps the uid's processes out before it reports the exit.
* :mod:`.percall` (``lifecycle = "call"``): a container per call, tini and ``sleep infinity`` as
  a keeper uid, the call one ``docker exec`` as the command uid; the container goes with the call.

Around them: :mod:`.client` (the client, and the one place ``docker.errors.*`` become ours, so
none crosses a public call), :mod:`.config` (the container's ``create()`` arguments: every
confinement knob), :mod:`.runtime` (one container's blocking operations), :mod:`.streams` (the
hijacked sockets as anyio streams) and :mod:`.gc` (containers nobody else will remove). Blocking
SDK calls run in worker threads; output is read from hijacked sockets in dedicated threads that
feed bounded memory streams as frames arrive.

This package imports the docker SDK: only :func:`sandbox.backends.base.get` loads it, when the
docker backend is asked for.
"""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING, Any

import anyio.to_thread

from sandbox.backends import seal
from sandbox.backends.base import Backend, get
from sandbox.backends.docker.client import (
    API_TIMEOUT_S,
    DEFAULT_IMAGE,
    IMAGE_REPOSITORY,
    IMAGE_VERSION_LABEL,
    PROBE_TIMEOUT_S,
    check_image,
    connect,
    image_ref,
    translated,
)
from sandbox.backends.docker.config import (
    KEEPER_USER,
    LABEL_JAIL,
    LABEL_LIFECYCLE,
    LABEL_OWNER,
    LABEL_OWNER_STARTED,
    LABEL_VERSION,
    container_config,
    exec_user,
    owner_labels,
    uid_gid,
)
from sandbox.backends.docker.gc import gc
from sandbox.backends.docker.jail import DockerJail
from sandbox.backends.docker.links import socket_wanted
from sandbox.backends.docker.percall import PerCallJail
from sandbox.backends.docker.warm import WarmJail
from sandbox.backends.environment import host_files
from sandbox.errors import BackendUnavailable, InvalidArgument, map_errors
from sandbox.guarantees import Report
from sandbox.mounts import CopyTree

if TYPE_CHECKING:
    from pathlib import Path

    import docker

    from sandbox.network.egress import Egress
    from sandbox.profile import Profile

__all__ = [
    "API_TIMEOUT_S",
    "DEFAULT_IMAGE",
    "IMAGE_REPOSITORY",
    "IMAGE_VERSION_LABEL",
    "KEEPER_USER",
    "LABEL_JAIL",
    "LABEL_LIFECYCLE",
    "LABEL_OWNER",
    "LABEL_OWNER_STARTED",
    "LABEL_VERSION",
    "PROBE_TIMEOUT_S",
    "DockerBackend",
    "DockerJail",
    "PerCallJail",
    "WarmJail",
    "backend_class",
    "check_image",
    "connect",
    "container_config",
    "exec_user",
    "gc",
    "image_ref",
    "owner_labels",
    "probe",
]


class DockerBackend(Backend):
    name = "docker"

    def _probe(self) -> Report:
        return _report()

    async def _open(
        self, workspace: Path, profile: Profile, *, scratch: Path | None, egress: Egress | None
    ) -> DockerJail:
        if profile.mount.strategy == "overlay":
            raise InvalidArgument("the docker backend has no overlay mount; use copy", backend="docker")
        user = exec_user(profile, workspace)
        uid_gid(user)
        host_files(profile)  # a refused env.files entry fails here, before a client or a copy exists
        jail = await _new_jail(workspace, profile, user, scratch, egress)
        async with contextlib.AsyncExitStack() as cleanup_on_fail:
            # The jail owns the client and the copy now; its aclose shields itself from cancellation.
            cleanup_on_fail.push_async_callback(jail.aclose)
            if jail.tree is not None:
                await anyio.to_thread.run_sync(_own_tree, jail.tree, user)
            if scratch is not None:
                await anyio.to_thread.run_sync(_own_dir, scratch, user)
            await jail.start()
            cleanup_on_fail.pop_all()
        return jail


async def _new_jail(
    workspace: Path, profile: Profile, user: str, scratch: Path | None, egress: Egress | None
) -> DockerJail:
    """A jail of the profile's lifecycle, with its client and its private copy; nothing started."""
    client = await anyio.to_thread.run_sync(connect)
    kind = WarmJail if profile.docker.lifecycle == "session" else PerCallJail
    with contextlib.ExitStack() as cleanup_on_fail:
        cleanup_on_fail.callback(client.close)
        await anyio.to_thread.run_sync(check_image, client, image_ref(profile))
        copy = profile.mount.strategy == "copy"
        sealed = await anyio.to_thread.run_sync(seal.for_profile, profile, workspace)
        # A copy leaves the masked secrets out: the container masks their (empty) mount points.
        exclude = (*profile.mount.exclude, *sealed.masked_paths)
        tree = await CopyTree.prepare(workspace, exclude=exclude) if copy else None
        if tree is not None:
            cleanup_on_fail.callback(tree.remove)
        source = tree.root if tree else workspace
        jail = kind(client, workspace, profile, source, tree, user, scratch, egress, sealed)
        cleanup_on_fail.pop_all()
    return jail


def _own_tree(tree: CopyTree, user: str) -> None:
    """Hand the private copy to the command uid (see ``CopyTree.hand_to``)."""
    with map_errors("cannot hand the private copy to the jail's user", BackendUnavailable):
        tree.hand_to(*uid_gid(user))


def _own_dir(path: Path, user: str) -> None:
    """Hand the session's scratch directory (ours, not the user's) to the command uid."""
    uid, gid = uid_gid(user)
    if os.geteuid() != 0 or path.stat().st_uid == uid:
        return
    with map_errors("cannot hand the scratch directory to the jail's user", BackendUnavailable):
        for dirpath, dirnames, filenames in os.walk(path):
            os.chown(dirpath, uid, gid)
            for name in dirnames + filenames:
                os.chown(os.path.join(dirpath, name), uid, gid, follow_symlinks=False)


_PROVIDED = (
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
    "fsize-limit",
    "tmp-size-limit",
)


def _security_options(info: dict[str, Any]) -> dict[str, str]:
    found: dict[str, str] = {}
    for option in info.get("SecurityOptions") or []:
        fields = dict(part.split("=", 1) for part in str(option).split(",") if "=" in part)
        if "name" in fields:
            found[fields["name"]] = fields.get("profile", "on")
    return found


def _grant_limits(report: Report, info: dict[str, Any]) -> None:
    cgroup = f"cgroup v{info.get('CgroupVersion', '1')} ({info.get('CgroupDriver', '?')})"
    report.details["cgroup"] = cgroup
    report.grant("memory-limit", bool(info.get("MemoryLimit")), f"the daemon's {cgroup} has no memory limit")
    report.grant("pids-limit", bool(info.get("PidsLimit")), f"the daemon's {cgroup} has no pids limit")
    report.grant("cpu-limit", bool(info.get("CpuCfsQuota")), f"the daemon's {cgroup} has no CPU quota")
    report.details["swap-limit"] = bool(info.get("SwapLimit"))


def _probe_report(client: docker.DockerClient) -> Report:
    info: dict[str, Any] = client.info()
    report = Report("docker", True)
    from sandbox.network import netns

    transparent = netns.available()
    report.grant("net-transparent", transparent is None, transparent or "")
    no_socket = socket_wanted(str(client.api.base_url))
    report.details.update(
        server=info.get("ServerVersion"),
        host=client.api.base_url,
        image=DEFAULT_IMAGE,
        kernel=info.get("KernelVersion"),
        # How a warm jail's output travels: our own pipes (socket) or through dockerd (attach).
        stream="socket" if no_socket is None else f"attach ({no_socket})",
    )
    try:
        check_image(client, DEFAULT_IMAGE)
    except BackendUnavailable as exc:
        unavailable = Report("docker", False, exc.message)
        unavailable.details = report.details
        return unavailable
    security = _security_options(info)
    report.details["userns-remap"] = "userns" in security
    report.details["rootless"] = "rootless" in security
    for name in _PROVIDED:
        report.grant(name, True)
    _grant_limits(report, info)
    seccomp = security.get("seccomp")
    report.grant(
        "seccomp", seccomp is not None and seccomp != "unconfined", "the daemon runs containers without seccomp"
    )
    report.details["seccomp-profile"] = seccomp
    report.grant("overlay", False, "the docker backend offers ro, rw and copy mounts, not overlay")
    return report


def _report() -> Report:
    """Daemon reachable (short timeout), image present, what the daemon enforces."""
    try:
        client = connect(PROBE_TIMEOUT_S)
    except BackendUnavailable as exc:
        return Report("docker", False, exc.message)
    try:
        with translated("cannot query the Docker daemon"):
            return _probe_report(client)
    except BackendUnavailable as exc:
        return Report("docker", False, exc.message)
    finally:
        client.close()


def probe() -> Report:
    """The loaded docker backend's report (cached by it); kept for callers of the module function."""
    return get("docker").probe()


backend_class = DockerBackend
