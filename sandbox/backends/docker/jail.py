"""What the two Docker jails share: the client, the container's config, the closing.

:class:`DockerJail` is the common base of :class:`~sandbox.backends.docker.warm.WarmJail` (one
container per session, an agent as its PID 1) and
:class:`~sandbox.backends.docker.percall.PerCallJail` (a container per call); the backend picks
one by the profile's ``docker.lifecycle``.
"""

from __future__ import annotations

import uuid
from abc import abstractmethod
from typing import TYPE_CHECKING

import anyio
import anyio.to_thread

from sandbox.backends.base import Jail, off_loop
from sandbox.backends.docker.client import run_sync
from sandbox.backends.docker.config import container_config
from sandbox.backends.docker.gc import remove_jail_containers

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

    import docker

    from sandbox.backends.docker.runtime import Runtime
    from sandbox.backends.seal import Seal
    from sandbox.mounts import CopyTree
    from sandbox.network.egress import Egress
    from sandbox.profile import Profile


class DockerJail(Jail):
    backend = "docker"
    agent = False  # whether the container's only process is the agent (warm) or tini (per call)

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
    ) -> None:
        self.client = client
        self.workspace = workspace
        self.profile = profile
        self.tree = tree
        self.user = user
        self.egress = egress
        self.id = uuid.uuid4().hex[:12]
        self._config = container_config(
            profile,
            self.id,
            workspace,
            source,
            scratch,
            agent_user=user if self.agent else None,
            untracked=tree.untracked if tree is not None else (),
            egress_dir=egress.socket_dir if egress is not None else None,
            sealed=sealed,
            shared=shared,
        )

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
