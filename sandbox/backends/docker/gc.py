"""Containers nobody will remove: a closing jail's strays and the leftovers of dead executors.

Every container we create carries owner labels (:func:`~sandbox.backends.docker.config.owner_labels`):
the executor's pid, host and start time, and the jail's id. A jail removes everything with its
id when it closes; ``sandbox gc`` removes what an executor that is gone left behind.
"""

from __future__ import annotations

import contextlib
import socket
from typing import TYPE_CHECKING

import docker
import docker.errors
import psutil

from sandbox.backends.docker.client import connect, translated
from sandbox.backends.docker.config import LABEL_JAIL, LABEL_OWNER, LABEL_OWNER_STARTED
from sandbox.backends.docker.links import stale_listener_dirs
from sandbox.backends.docker.runtime import remove_container

if TYPE_CHECKING:
    from collections.abc import Mapping


def remove_jail_containers(client: docker.DockerClient, jail_id: str) -> None:
    """Force-remove every container of a jail; each one alone (auto-remove may race us), one's
    failure no reason to leave the others."""
    try:
        # The low-level list: the high-level one inspects each container and trips on a vanished one.
        found = client.api.containers(all=True, filters={"label": f"{LABEL_JAIL}={jail_id}"})
    except (docker.errors.DockerException, OSError):
        return  # the engine is gone; auto-remove, or `sandbox gc`, takes its containers
    for row in found:
        with contextlib.suppress(docker.errors.DockerException, OSError):
            remove_container(client, str(row["Id"]))


def _owner_gone(labels: Mapping[str, str]) -> bool:
    pid_text, _, host = labels.get(LABEL_OWNER, "").partition("@")
    if host != socket.gethostname() or not pid_text.isdigit():
        return False  # another machine's executor: we cannot tell, leave it
    try:
        started = psutil.Process(int(pid_text)).create_time()
    except psutil.Error:
        return True
    return f"{started:.2f}" != labels.get(LABEL_OWNER_STARTED)


def gc(all: bool = False) -> list[str]:
    """Remove sandbox containers whose executor is gone (every sandbox container with ``all``).

    Returns the names of the containers removed.
    """
    removed: list[str] = []
    with contextlib.closing(connect()) as client:
        with translated("cannot list sandbox containers"):
            rows = client.api.containers(all=True, filters={"label": LABEL_OWNER})
        for row in rows:
            if all or _owner_gone(row.get("Labels") or {}):
                name = str((row.get("Names") or [row["Id"]])[0]).lstrip("/")
                with translated(f"cannot remove container {name}"):
                    remove_container(client, str(row["Id"]))
                removed.append(name)
        removed += _gc_volumes(client, all)
    # No label marks these: a listener's socket directory, left by an executor killed while one
    # of its containers started (each per-call container is one such start).
    stale_listener_dirs()
    return removed


def _gc_volumes(client: docker.DockerClient, all: bool) -> list[str]:
    """A remote copy's volumes (see :mod:`.archive`) whose executor is gone; one still in use stays."""
    with translated("cannot list sandbox volumes"):
        rows = client.api.volumes(filters={"label": LABEL_OWNER}).get("Volumes") or []
    removed = []
    for row in rows:
        if all or _owner_gone(row.get("Labels") or {}):
            with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):  # 409: in use
                client.api.remove_volume(row["Name"])
                removed.append(f"volume {row['Name']}")
    return removed
