"""The Docker jail: a container per session (warm) or per call, through the docker SDK only.

Two process models, one module each, behind the common :class:`~.jail.DockerJail`:

* :mod:`.warm` (``lifecycle = "session"``): one container for the session, whose only process
  is the stdlib agent of :mod:`sandbox._jailside.agent`, PID 1 and the command uid. A call is a
  request over a unix socket of ours bound into the container, with the call's pipe ends passed
  along (:mod:`.links`; the attach stream is the fallback), and a fork in the container, no
  ``docker exec``; the agent sweeps the uid's processes out before it reports the exit.
* :mod:`.percall` (``lifecycle = "call"``): a fresh container per call, with the same agent as
  its PID 1 and the same links, taken from the jail's :mod:`.pool` of containers started ahead
  (never one container for two calls); the call is one request to its agent, and the container
  is removed once the call is over. Both share :class:`~.warm.AgentJail`.

Around them: :mod:`.client` (the client, and the one place ``docker.errors.*`` become ours, so
none crosses a public call), :mod:`.config` (the container's ``create()`` arguments: every
confinement knob), :mod:`.runtime` (one container's blocking operations), :mod:`.streams` (the
hijacked sockets as anyio streams), :mod:`.gc` (containers nobody else will remove) and
:mod:`.gvisor` (the OCI runtime, by the engine's name, and what gVisor's ``runsc`` changes: a
profile's report comes from :meth:`DockerBackend.probe_for`, per runtime). Blocking
SDK calls run in worker threads; output is read from hijacked sockets in dedicated threads that
feed bounded memory streams as frames arrive.

A remote engine (``[docker] host = "tcp://…"`` or ``"ssh://…"`` with its TLS files, or
``DOCKER_HOST``; see :func:`.client.engine_of`) cannot see this host's files: only ``copy``
mounts are offered there, the private copy travelling into a volume of the engine's and back as
tar streams (:mod:`.archive`), every member checked; ``rw``, ``ro``, ``overlay``, the allowlist
network and ``env.files`` are refused with the reason (each needs a bind), and the agents' calls
take the attach stream because the engine is remote.

This package imports the docker SDK: only :func:`sandbox.backends.base.get` loads it, when the
docker backend is asked for.
"""

from __future__ import annotations

import contextlib
import functools
import os
from typing import TYPE_CHECKING, Any

import anyio.to_thread

from sandbox.backends import seal
from sandbox.backends.base import Backend, get, seed_tree
from sandbox.backends.docker import gvisor
from sandbox.backends.docker.archive import Limits, RemoteTree, populate
from sandbox.backends.docker.client import (
    API_TIMEOUT_S,
    DEFAULT_IMAGE,
    IMAGE_REPOSITORY,
    IMAGE_VERSION_LABEL,
    PROBE_TIMEOUT_S,
    Engine,
    check_image,
    connect,
    engine_name,
    engine_of,
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
    for_remote_engine,
    owner_labels,
    uid_gid,
)
from sandbox.backends.docker.gc import gc
from sandbox.backends.docker.jail import DockerJail
from sandbox.backends.docker.links import socket_wanted
from sandbox.backends.docker.percall import PerCallJail
from sandbox.backends.docker.runtime import EngineTraits, traits
from sandbox.backends.docker.warm import AgentJail, WarmJail
from sandbox.backends.environment import host_files
from sandbox.errors import BackendUnavailable, InvalidArgument, map_errors
from sandbox.guarantees import Report
from sandbox.mounts import CopyTree

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

    import docker

    from sandbox.network.egress import Egress
    from sandbox.profile import Profile
    from sandbox.snapshots import Snapshot

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
    snapshots = True
    binds_downloads = True

    def __init__(self) -> None:
        super().__init__()
        self._by_runtime: dict[str, Report] = {}

    def _probe(self) -> Report:
        return _report()

    def probe_for(self, profile: Profile) -> Report:
        """The report for the profile's ``[docker] runtime`` (cached per runtime, as :meth:`probe`)."""
        runtime = profile.docker.runtime
        if runtime is None:
            return self.probe()
        if runtime not in self._by_runtime:
            report = _report(runtime)
            if report.details.get("transient"):
                return report
            self._by_runtime[runtime] = report
        return self._by_runtime[runtime]

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
    ) -> DockerJail:
        if profile.mount.strategy == "overlay":
            raise InvalidArgument("the docker backend has no overlay mount; use copy", backend="docker")
        engine = engine_of(profile.docker)
        if engine.remote is not None:
            _check_remote(profile, engine.remote, shared)
        user = exec_user(profile, workspace)
        uid_gid(user)
        host_files(profile)  # a refused env.files entry fails here, before a client or a copy exists
        jail = await _new_jail(workspace, profile, user, scratch, egress, engine, shared, downloads)
        async with contextlib.AsyncExitStack() as cleanup_on_fail:
            # The jail owns the client and the copy now; its aclose shields itself from cancellation.
            cleanup_on_fail.push_async_callback(jail.aclose)
            if jail.tree is not None:
                await anyio.to_thread.run_sync(_own_tree, jail.tree, user)
            for area in (scratch, downloads):
                if area is not None and engine.remote is None:
                    await anyio.to_thread.run_sync(own_dir, area, user)
            if isinstance(jail.tree, RemoteTree):
                await _to_remote(jail, jail.tree, engine, scratch)
            # After the hand-over (which takes the copy's baseline anew), before any container:
            # its masks are made over what the seed put.
            await seed_tree(jail.tree, seed, self.name)
            await jail.start()
            cleanup_on_fail.pop_all()
        return jail


def _check_remote(profile: Profile, why: str, shared: Sequence[tuple[str, str]] = ()) -> None:
    """Refuse what an engine that cannot see this host's files cannot give (``why``: how we know)."""
    mount = profile.mount.strategy
    if mount != "copy":
        what = "binds the workspace read-write" if mount == "rw" else "binds the workspace read-only"
        raise InvalidArgument(
            f"mount {mount!r} {what}, which a remote engine cannot do ({why}); use mount.strategy = "
            "'copy': the workspace then travels through the archive API and comes back as a changeset",
            backend="docker",
            mount=mount,
            remote=why,
        )
    refusals = (  # what binds something of this host into the container, and what to do instead
        (
            profile.network.mode == "allowlist",
            "network 'allowlist' binds the filtering proxy's socket into the container",
            "use network 'none' or 'host'",
        ),
        (bool(host_files(profile)), "env.files binds host files into the jail's home", ""),
        (bool(shared), "plugin tools bind their directories into the jail", ""),
        (
            profile.mount.download_cache == "project",
            "mount.download_cache = 'project' binds a directory of this host into the container",
            "set it to 'off'",
        ),
        (
            profile.docker.ca_certificates == "host",
            'docker.ca_certificates = "host" binds this host\'s CA bundle into the container',
            'use an image that trusts them, or docker.ca_certificates = "image"',
        ),
    )
    for refused, what, instead in refusals:
        if refused:
            remedy = f"; {instead}" if instead else ""
            raise InvalidArgument(
                f"{what}, which a remote engine cannot do ({why}){remedy}", backend="docker", remote=why
            )


async def _new_jail(
    workspace: Path,
    profile: Profile,
    user: str,
    scratch: Path | None,
    egress: Egress | None,
    engine: Engine,
    shared: Sequence[tuple[str, str]] = (),
    downloads: Path | None = None,
) -> DockerJail:
    """A jail of the profile's lifecycle, with its client and its private copy; nothing started."""
    client = await anyio.to_thread.run_sync(functools.partial(connect, engine=engine))
    kind = WarmJail if profile.docker.lifecycle == "session" else PerCallJail
    with contextlib.ExitStack() as cleanup_on_fail:
        cleanup_on_fail.callback(client.close)
        runtime = await anyio.to_thread.run_sync(_runtime_of, client, profile)
        await anyio.to_thread.run_sync(check_image, client, image_ref(profile))
        copy = profile.mount.strategy == "copy"
        sealed = await anyio.to_thread.run_sync(seal.for_profile, profile, workspace)
        # A copy leaves the masked secrets out: the container masks their (empty) mount points.
        exclude = (*profile.mount.exclude, *sealed.masked_paths)
        tree_kind = CopyTree if engine.remote is None else RemoteTree
        cache = profile.mount.environment_cache == "project"
        environment = profile.mount.environment
        tree = (
            await tree_kind.prepare(workspace, exclude=exclude, environment_cache=cache, environment=environment)
            if copy
            else None
        )
        if tree is not None:
            cleanup_on_fail.callback(tree.remove)
        source = tree.root if tree else workspace
        jail = kind(
            client, workspace, profile, source, tree, user, scratch, egress, sealed, shared, downloads, runtime=runtime
        )
        cleanup_on_fail.pop_all()
    return jail


def _runtime_of(client: docker.DockerClient, profile: Profile) -> gvisor.RuntimeChoice:
    """The runtime the profile's containers will run under, asked of the engine now (the probe is
    cached): one it has not registered, or cannot give the profile, is refused here."""
    with translated("cannot query the Docker daemon"):
        info: dict[str, Any] = client.info()
        choice = gvisor.resolve(info, profile.docker.runtime, traits(client).podman)
    gvisor.refusal(profile, choice)
    return choice


async def _to_remote(jail: DockerJail, tree: RemoteTree, engine: Engine, scratch: Path | None) -> None:
    """Fill the remote engine's volume from the private copy; the jail's containers mount it and bind nothing.

    A warm jail's calls take the attach stream: decided here, by the engine being remote, not left
    to the chance of a bind of our socket's directory failing on that engine (or, worse, binding
    some other directory of that host by the same name).
    """
    labels = owner_labels(jail.id, jail.profile.docker.lifecycle)
    tree.engine = engine
    tree.limits = Limits(member=jail.profile.limits.file_size or Limits().member)
    tree.owner = uid_gid(jail.user) if os.geteuid() == 0 else None
    image = image_ref(jail.profile)
    tree.carrier = await anyio.to_thread.run_sync(populate, jail.client, image, tree, jail.user, labels)
    jail._config = for_remote_engine(jail._config, tree.carrier.mount(), jail.user, scratch)
    if isinstance(jail, AgentJail):  # warm and per-call jails alike: each container's agent
        jail._no_socket = jail.stream_note = f"a remote engine cannot bind our socket's directory ({engine.remote})"


def _own_tree(tree: CopyTree, user: str) -> None:
    """Hand the private copy to the command uid (see ``CopyTree.hand_to``)."""
    with map_errors("cannot hand the private copy to the jail's user", BackendUnavailable):
        tree.hand_to(*uid_gid(user))


def own_dir(path: Path, user: str) -> None:
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


def _grant_limits(report: Report, info: dict[str, Any], found: EngineTraits) -> None:
    cgroup = f"cgroup v{info.get('CgroupVersion', '1')} ({info.get('CgroupDriver', '?')})"
    report.details["cgroup"] = cgroup
    # Rootless Podman's compatible info claims every limit, then drops them: libpod's word counts.
    dropped = found.limits_unavailable()
    for guarantee, key, what in (
        ("memory-limit", "MemoryLimit", "memory limit"),
        ("pids-limit", "PidsLimit", "pids limit"),
        ("cpu-limit", "CpuCfsQuota", "CPU quota"),
    ):
        why = dropped.get(guarantee) or f"the daemon's {cgroup} has no {what}"
        report.grant(guarantee, bool(info.get(key)) and guarantee not in dropped, why)
    # Each limit's mechanism where the engine lacks a controller (an rlimit stand-in, or none: a
    # profile asking for that limit is then refused, see Report.refused_limits).
    report.limits = found.enforcement()
    report.details["swap-limit"] = bool(info.get("SwapLimit")) and "memory-limit" not in dropped


def _probe_report(client: docker.DockerClient, engine: Engine | None = None, runtime: str | None = None) -> Report:
    engine = engine or engine_of()
    info: dict[str, Any] = client.info()
    report = Report("docker", True)
    from sandbox.network import netns

    transparent = netns.available()
    no_socket = engine.remote or socket_wanted(str(client.api.base_url))
    report.details.update(
        engine=engine_name(client.version()),
        server=info.get("ServerVersion"),
        host=client.api.base_url,
        # Remote: the engine cannot see this host's files (see .client.engine_of for how we tell).
        remote=engine.remote or False,
        mounts=["copy (archive API)"] if engine.remote else ["ro", "rw", "copy"],
        tls=engine.tls or bool(os.environ.get("DOCKER_TLS_VERIFY") or os.environ.get("DOCKER_CERT_PATH")),
        image=DEFAULT_IMAGE,
        kernel=info.get("KernelVersion"),
        # How a warm jail's output travels: our own pipes (socket) or through dockerd (attach).
        stream="socket" if no_socket is None else f"attach ({no_socket})",
    )
    if engine.remote:
        report.advice.append(
            f"{report.details['engine']}: {engine.remote}, so it cannot see this host's files: only copy "
            "mounts, through the archive API; rw, ro and overlay are refused, warm calls use the attach stream"
        )
        # The filtering proxy's socket and the container's network namespace are this host's.
        report.grant("net-transparent", False, f"a remote engine's containers are not on this host ({engine.remote})")
    else:
        report.grant("net-transparent", transparent is None, transparent or "")
    try:
        check_image(client, DEFAULT_IMAGE)
    except BackendUnavailable as exc:
        unavailable = Report("docker", False, exc.message)
        unavailable.details = report.details
        return unavailable
    security = _security_options(info)
    found = traits(client)
    report.details["userns-remap"] = "userns" in security
    report.details["rootless"] = "rootless" in security or found.rootless
    for name in _PROVIDED:
        report.grant(name, True)
    if engine.remote:
        report.grant(
            "net-allowlist", False, f"the filtering proxy's socket cannot reach a remote engine ({engine.remote})"
        )
    _grant_limits(report, info, found)
    seccomp = security.get("seccomp")
    report.grant(
        "seccomp", seccomp is not None and seccomp != "unconfined", "the daemon runs containers without seccomp"
    )
    report.details["seccomp-profile"] = seccomp
    report.grant("overlay", False, "the docker backend offers ro, rw and copy mounts, not overlay")
    return _with_runtime(report, info, runtime, found.podman, engine.remote)


def _with_runtime(
    report: Report, info: dict[str, Any], runtime: str | None, podman: bool, remote: str | None
) -> Report:
    """``report`` for containers of the runtime ``runtime`` (``None``: the engine's default); one the
    engine has not registered makes the backend unavailable for it, with the reason (see .gvisor)."""
    report.details["runtimes"] = sorted(gvisor.registered(info))
    report.details["default-runtime"] = info.get("DefaultRuntime")
    report.details["gvisor"] = gvisor.describe(info, remote)
    report.notes.append(gvisor.status(report.details["gvisor"]))
    try:
        choice = gvisor.resolve(info, runtime, podman)
    except BackendUnavailable as exc:
        unavailable = Report("docker", False, exc.message)
        unavailable.details = report.details
        return unavailable
    gvisor.apply(report, choice)
    if choice.gvisor and gvisor.socket_refusal(choice) and not report.details["stream"].startswith("attach"):
        report.details["stream"] = f"attach ({gvisor.socket_refusal(choice)})"
    return report


def _report(runtime: str | None = None) -> Report:
    """Daemon reachable (short timeout), image present, what the daemon enforces; the engine's name
    and version, and whether it is remote (then only ``copy`` mounts, through the archive API);
    all of it for containers of ``runtime`` (``[docker] runtime``; ``None``: the engine's default)."""
    engine = engine_of()
    try:
        client = connect(PROBE_TIMEOUT_S, engine)
    except BackendUnavailable as exc:
        return Report("docker", False, exc.message)
    try:
        with translated("cannot query the Docker daemon"):
            return _probe_report(client, engine, runtime)
    except BackendUnavailable as exc:
        return Report("docker", False, exc.message)
    finally:
        client.close()


def probe() -> Report:
    """The loaded docker backend's report (cached by it); kept for callers of the module function."""
    return get("docker").probe()


backend_class = DockerBackend
