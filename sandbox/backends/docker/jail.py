"""What the two Docker jails share: the client, the container's config, the closing.

:class:`DockerJail` is the common base of :class:`~sandbox.backends.docker.warm.WarmJail` (one
container per session, an agent as its PID 1) and
:class:`~sandbox.backends.docker.percall.PerCallJail` (a container per call); the backend picks
one by the profile's ``docker.lifecycle``.
"""

from __future__ import annotations

import functools
import uuid
from abc import abstractmethod
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread

from sandbox.backends import seal
from sandbox.backends.base import Jail
from sandbox.backends.docker.client import run_sync
from sandbox.backends.docker.config import ca_env, container_config, uid_gid
from sandbox.backends.docker.gc import remove_jail_containers
from sandbox.backends.docker.gvisor import SENTRY_PIDS
from sandbox.backends.jailpython import IMAGE_PYTHON
from sandbox.threads import off_loop, soon

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from pathlib import Path

    import docker

    from sandbox.backends.base import Process
    from sandbox.backends.docker.gvisor import RuntimeChoice
    from sandbox.backends.docker.runtime import Runtime
    from sandbox.backends.seal import Seal
    from sandbox.mounts import CopyTree
    from sandbox.network.egress import Egress
    from sandbox.profile import Profile


class DockerJail(Jail):
    backend = "docker"
    agent = False  # whether the container's only process is the agent (warm) or tini (per call)
    python = IMAGE_PYTHON  # the image's, by its absolute path (config.container_config checks the mounts)

    def __init__(
        self,
        client: docker.DockerClient,
        workspace: Path,
        profile: Profile,
        source: Path,
        tree: CopyTree | None,
        user: str,
        scratch: Path | None = None,
        egress: Egress | None = None,
        sealed: Seal | None = None,
        shared: Sequence[tuple[str, str]] = (),
        downloads: Path | None = None,
        *,
        runtime: RuntimeChoice | None = None,
    ) -> None:
        self.client = client
        self.oci_runtime = runtime  # the OCI runtime its containers run under (None: not asked, the engine's default)
        self.workspace = workspace
        self.profile = profile
        self.tree = tree
        self.user = user
        self.egress = egress
        self.id = uuid.uuid4().hex[:12]
        sealed = sealed if sealed is not None else seal.for_profile(profile, workspace)
        self._configure = functools.partial(
            container_config,
            profile,
            self.id,
            workspace,
            source,
            scratch,
            agent_user=user if self.agent else None,
            untracked=tree.untracked if tree is not None else (),
            egress_dir=egress.socket_dir if egress is not None else None,
            shared=shared,
            downloads=downloads,
            runtime_pids=SENTRY_PIDS if runtime is not None and runtime.gvisor else 0,
        )
        self._config = self._configure(sealed=sealed)
        # The seal is searched again before each call (seal.Watch): the config is rebuilt when it moved.
        self._watch = seal.watch(profile, workspace, source, tree, sealed, shared)
        if egress is not None:  # the proxy's socket is private to us until the command user is let in
            egress.admit(*uid_gid(user))
            if runtime is not None and runtime.gvisor:
                # A connection accepted in the Sentry's network stack is no host socket: it cannot be
                # handed to the proxy (SCM_RIGHTS to a host socket), so the forwarder relays its bytes.
                egress.forwarder_copy = "plain"

    async def spawn(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, **more: Any) -> Process:
        # ca_certificates = "host": every call's clients are pointed at the bound bundle (the call's own env wins).
        return await super().spawn(argv, env={**ca_env(self.profile), **(env or {})}, **more)

    @property
    def host_writable(self) -> tuple[Path, ...]:
        # A remote engine's jail writes that engine's disk (its volume, a tmpfs scratch), none of ours.
        from sandbox.backends.docker.archive import RemoteTree

        return () if isinstance(self.tree, RemoteTree) else super().host_writable

    async def _resealed(self) -> bool:
        """Search the seal again before a call (cached, cheap); when a mask moved, rebuild the
        containers' config and say so: the caller replaces what was started with the old one.
        (A remote engine's copy lives on its volume, sealed when it was filled: not searched here.)"""
        from sandbox.backends.docker.archive import RemoteTree

        if isinstance(self.tree, RemoteTree):
            return False
        sealed = await soon(self._watch.changed, inline=self._watch.quick)
        if sealed is None:
            return False
        self._config = self._configure(sealed=sealed)
        return True

    @property
    def container_id(self) -> str | None:
        """The session's container, for a warm jail that has one running."""
        return None

    async def start(self) -> None:
        """Start what the jail runs before its first call."""

    async def _way_out(self, runtime: Runtime) -> None:
        """A transparent jail's container: its veth pair and rules, before any command of it runs."""
        if self.egress is None or not self.egress.transparent:
            return
        pid = await run_sync("cannot find the container's process", runtime.pid)
        with anyio.CancelScope(shield=True):
            await off_loop(self.egress.attach, pid)

    @abstractmethod
    def _release_calls(self) -> None:
        """Release every call still held (closing: its container is about to go)."""

    def _disconnect(self) -> None:
        """Drop what the jail holds besides the client, once its containers are gone."""

    async def _shutdown(self) -> None:
        self._release_calls()
        # Removing the containers kills everything in them; the label catches any stray one.
        await anyio.to_thread.run_sync(remove_jail_containers, self.client, self.id)
        self._disconnect()
        self.client.close()
