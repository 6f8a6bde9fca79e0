"""One running container and the blocking operations on it (run them in a worker thread).

Both process models drive their containers through :class:`Runtime`: create and start (attached
first, for the warm agent), exec, list the command uid's processes, read the daemon's events to
tell why a container died, kill, remove.

Podman's Docker-compatible API takes the same ``create()`` arguments with differences that
:func:`create_container` makes up for (see :class:`EngineTraits`): a request that sets any ulimit gets
``nproc`` and ``nofile`` of 1,048,576 unless it names them, which runc cannot raise to without
CAP_SYS_RESOURCE; a rootless engine ignores ulimits altogether (``prlimit`` sets them instead, see
:func:`prlimit_prefix`); and a rootless engine maps its own uid to the container's root, so the
command uid (the workspace owner) would be a subordinate uid that cannot write the workspace,
unless the container keeps the caller's id (``UsernsMode=keep-id``, which docker-py refuses to
send). Its events differ too (see :meth:`Runtime._events`).
"""

from __future__ import annotations

import contextlib
import math
import re
import resource
import socket
import struct
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import docker
import docker.errors
from docker.models.containers import _create_container_args  # type: ignore[attr-defined]
from docker.types import Ulimit

from sandbox.backends.docker.client import quietly, remove_by_id
from sandbox.backends.docker.config import KEEPER_USER
from sandbox.guarantees import Enforcement

if TYPE_CHECKING:
    from docker.models.containers import Container

# PID 1 is the agent of a warm container (the command uid too) or tini: never the call's.
LIST = "ps -u \"$1\" -o pid=,stat= | awk '$1 != 1 && $2 !~ /^Z/ {print $1}'"
PODMAN_RLIMIT_DEFAULT = 1048576  # what Podman asks for nproc and nofile when a request names neither
_RLIMITS = {"nproc": resource.RLIMIT_NPROC, "nofile": resource.RLIMIT_NOFILE}
_LIMITS_ROW = {"nproc": "Max processes", "nofile": "Max open files"}
_PEERCRED = struct.Struct("3i")
OUTSIDE_EVENTS = ("kill", "die", "stop", "destroy", "remove", "oom")  # what ends a container from outside


def _action(event: dict[str, Any]) -> str:
    return str(event.get("status") or event.get("Action"))


@dataclass(frozen=True)
class EngineTraits:
    """What the engine behind a client is, as far as creating a container differs by it."""

    name: str = "Docker Engine"
    version: str = ""
    rootless: bool = False
    # The engine's own hard limits (a local engine's process): the most a container can be given.
    hard_limits: dict[str, int] = field(default_factory=dict)
    # Podman's cgroup version and the controllers it may set limits with (libpod's own info:
    # its Docker-compatible info claims every limit even where a rootless engine drops them).
    cgroup_version: str = ""
    controllers: tuple[str, ...] | None = None

    @property
    def podman(self) -> bool:
        return self.name.startswith("Podman")

    @property
    def own_userns(self) -> bool:
        """Whether each container has a user namespace of its own (rootless Podman with keep-id)."""
        return self.podman and self.rootless

    def rlimit_fallbacks(self) -> dict[str, str]:
        """Limit -> the rlimit that stands in for a cgroup controller this engine lacks (see bwrap's).

        RLIMIT_NPROC counts a uid's processes per user namespace: in a container's own, it caps
        the container's processes as a pids cgroup would; RLIMIT_DATA caps each process's memory.
        """
        if not self.own_userns or self.controllers is None:
            return {}
        found = {}
        if "pids" not in self.controllers:
            found["pids"] = "nproc"
        if "memory" not in self.controllers:
            found["memory"] = "data"
        return found

    def limits_unavailable(self) -> dict[str, str]:
        """Guarantee -> why not, for the cgroup limits this engine would accept and not enforce."""
        if self.controllers is None:
            return {}
        where = f"{'rootless ' if self.rootless else ''}Podman on cgroup {self.cgroup_version}"
        return {
            guarantee: f"{where} has no {controller} controller to set it with"
            for guarantee, controller in _CONTROLLERS.items()
            if controller not in self.controllers and not (guarantee == "pids-limit" and self.rlimit_fallbacks())
        }

    def enforcement(self) -> dict[str, Enforcement]:
        """How each limit is enforced in this engine's containers (empty: all by the engine itself)."""
        missing = self.limits_unavailable()
        fallbacks = self.rlimit_fallbacks()
        if not missing and not fallbacks:
            return {}
        found = {name: Enforcement(how, "process") for name, how in _PER_PROCESS.items()}
        found["tmp_size"] = Enforcement("tmpfs size", "call")
        for guarantee, limit in _LIMIT_OF.items():
            if limit == "pids" and "pids" in fallbacks:
                found[limit] = Enforcement("rlimit NPROC in the container's own user namespace", "call")
            elif limit == "memory" and "memory" in fallbacks:
                found[limit] = Enforcement("rlimit DATA", "process")
            elif guarantee in missing:
                found[limit] = Enforcement(None, why_not=missing[guarantee])
            else:
                found[limit] = Enforcement(f"cgroup {_CONTROLLERS[guarantee]}", "call")
        return found


_CONTROLLERS = {"memory-limit": "memory", "pids-limit": "pids", "cpu-limit": "cpu"}
_LIMIT_OF = {"memory-limit": "memory", "pids-limit": "pids", "cpu-limit": "cpus"}
_PER_PROCESS = {"cpu_time_s": "rlimit CPU", "file_size": "rlimit FSIZE", "nofile": "rlimit NOFILE"}
_TRAITS: weakref.WeakKeyDictionary[docker.DockerClient, EngineTraits] = weakref.WeakKeyDictionary()


def traits(client: docker.DockerClient) -> EngineTraits:
    """The client's engine, asked once per client (a version and, for Podman, an info request)."""
    found = _TRAITS.get(client)
    if found is None:
        found = _TRAITS[client] = _ask_traits(client)
    return found


def _ask_traits(client: docker.DockerClient) -> EngineTraits:
    version: dict[str, Any] = client.version()
    components = version.get("Components") or [{}]
    name = str(components[0].get("Name") or "Docker Engine")
    number = str(version.get("Version") or "")
    if not name.startswith("Podman"):
        return EngineTraits(name, number)
    # libpod's endpoints answer under the compatible API's version prefix too.
    reply = client.api.get(f"{client.api.base_url}/v{client.api.api_version}/libpod/info", timeout=client.api.timeout)
    reply.raise_for_status()
    host: dict[str, Any] = reply.json()["host"]
    return EngineTraits(
        name,
        number,
        rootless=bool(host.get("security", {}).get("rootless")),
        hard_limits=_engine_limits(client),
        cgroup_version=str(host.get("cgroupVersion") or ""),
        controllers=tuple(str(c) for c in host.get("cgroupControllers") or ()),
    )


def _engine_limits(client: docker.DockerClient) -> dict[str, int]:
    """A local engine's hard nproc and nofile limits, read from its process (the API socket's peer).

    Its containers' runc inherits them and cannot go beyond them without CAP_SYS_RESOURCE.
    Empty for a remote engine (no peer of ours to read).
    """
    path = getattr(getattr(client.api, "_custom_adapter", None), "socket_path", None)
    if not isinstance(path, str):
        return {}
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(3)
            sock.connect(path)
            pid = _PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))[0]
        text = Path(f"/proc/{pid}/limits").read_text(encoding="ascii")
    except OSError:
        return {}
    found: dict[str, int] = {}
    for key, row in _LIMITS_ROW.items():
        match = re.search(rf"^{row}\s+\S+\s+(\S+)", text, re.MULTILINE)
        if match:
            found[key] = resource.RLIM_INFINITY if match.group(1) == "unlimited" else int(match.group(1))
    return found


def podman_ulimits(ulimits: list[Ulimit], hard_limits: dict[str, int]) -> list[Ulimit]:
    """``ulimits`` with nproc and nofile named, so Podman does not ask for more than it may give.

    Unless a request names them, Podman gives both 1,048,576 (or containers.conf's defaults, but
    only to a request with no ulimits at all). Named here: the smaller of that and the engine's
    hard limit (or, not knowing the engine's, ours: the same host's defaults).
    """
    named = {str(limit.name) for limit in ulimits}
    added = []
    for key in ("nproc", "nofile"):
        if key in named:
            continue
        hard = hard_limits.get(key, resource.getrlimit(_RLIMITS[key])[1])
        value = PODMAN_RLIMIT_DEFAULT if hard == resource.RLIM_INFINITY else min(PODMAN_RLIMIT_DEFAULT, hard)
        added.append(Ulimit(name=key, soft=value, hard=value))
    return [*ulimits, *added]


def prlimit_prefix(client: docker.DockerClient, config: dict[str, Any]) -> list[str]:
    """The argv prefix that sets the config's rlimits where the engine drops them, else nothing.

    Rootless Podman's Docker API ignores ``HostConfig.Ulimits`` (Podman 4.3 passes them on only
    as root), so the limits are set by ``prlimit`` (util-linux, in the image) on the container's
    first process and on each exec: lowering a limit needs no privilege, raising it back needs
    CAP_SYS_RESOURCE, which the jail never has. The cgroup limits it has no controller for get
    their rlimit stand-ins (:meth:`EngineTraits.rlimit_fallbacks`).
    """
    found = traits(client)
    if not (found.podman and found.rootless):
        return []
    pairs = [(str(limit.name), int(limit.hard)) for limit in config.get("ulimits") or ()]
    fallbacks = found.rlimit_fallbacks()
    if "pids" in fallbacks and config.get("pids_limit"):
        pairs.append((fallbacks["pids"], int(config["pids_limit"])))
    if "memory" in fallbacks and config.get("mem_limit"):
        pairs.append((fallbacks["memory"], int(config["mem_limit"])))
    flags = [f"--{name}={value}:{value}" for name, value in pairs]
    return ["prlimit", *flags, "--"] if flags else []


def podman_tmpfs(tmpfs: dict[str, str]) -> dict[str, str]:
    """``tmpfs`` without ``nr_inodes``, which Podman 4.3 refuses as an unknown mount option: its
    tmpfs mounts keep their size cap and the kernel's default inode count (a known limit)."""
    kept = {path: [o for o in opts.split(",") if not o.startswith("nr_inodes=")] for path, opts in tmpfs.items()}
    return {path: ",".join(options) for path, options in kept.items()}


def create_container(client: docker.DockerClient, config: dict[str, Any]) -> Container:
    """``client.containers.create(**config)``, adapted to the engine (see the module doc)."""
    found = traits(client)
    if not found.podman:
        return client.containers.create(**config)
    config = {**config, "tmpfs": podman_tmpfs(config.get("tmpfs") or {})}
    if not found.rootless:
        config = {**config, "ulimits": podman_ulimits(list(config.get("ulimits") or []), found.hard_limits)}
        return client.containers.create(**config)
    prefix = prlimit_prefix(client, config)
    if prefix and config.get("entrypoint"):  # the warm agent; tini (the image's) keeps its own
        config = {**config, "entrypoint": [*prefix, *config["entrypoint"]]}
    # docker-py sends UsernsMode "host" only; Podman's API takes keep-id as its CLI does. The SDK's
    # own (private) split of create() arguments gives the host config to add it to.
    args = _create_container_args({**config, "version": client.api.api_version})
    args["host_config"]["UsernsMode"] = "keep-id"
    created = client.api.create_container(**args)
    return client.containers.get(created["Id"])


@dataclass
class Runtime:
    """One running container and the blocking operations on it (run them in a worker thread)."""

    client: docker.DockerClient
    container: Container
    user: str
    started: float = field(default_factory=time.time)
    oom_kills: int = 0
    removed: bool = False
    exec_prefix: tuple[str, ...] = ()  # what sets a call's rlimits where the engine drops them

    @property
    def id(self) -> str:
        return str(self.container.id)

    @classmethod
    def create(cls, client: docker.DockerClient, config: dict[str, Any], user: str) -> Runtime:
        container = create_container(client, config)
        with contextlib.ExitStack() as cleanup_on_fail:
            cleanup_on_fail.callback(quietly, lambda: container.remove(force=True))
            container.start()
            cleanup_on_fail.pop_all()
        return cls(client, container, user, exec_prefix=tuple(prlimit_prefix(client, config)))

    @classmethod
    def create_attached(cls, client: docker.DockerClient, config: dict[str, Any], user: str) -> tuple[Runtime, Any]:
        """Create, attach (before start: nothing the agent says is missed), start."""
        container = create_container(client, config)
        with contextlib.ExitStack() as cleanup_on_fail:
            cleanup_on_fail.callback(quietly, lambda: container.remove(force=True))
            sock = client.api.attach_socket(
                str(container.id), params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1}
            )
            cleanup_on_fail.callback(quietly, sock.close)
            container.start()
            cleanup_on_fail.pop_all()
        return cls(client, container, user), sock

    def pid(self) -> int:
        """The host pid of the container's first process (its namespaces are the container's)."""
        self.container.reload()
        return int(self.container.attrs["State"]["Pid"])

    def exec_start(self, argv: list[str], env: dict[str, str], cwd: str, stdin: bool) -> tuple[str, Any]:
        created = self.client.api.exec_create(
            self.id,
            [*self.exec_prefix, *argv],
            stdout=True,
            stderr=True,
            stdin=stdin,
            tty=False,
            environment=env,
            workdir=cwd,
            user=self.user,
        )
        exec_id = str(created["Id"])
        return exec_id, self.client.api.exec_start(exec_id, detach=False, tty=False, stream=False, socket=True)

    def exec_output(self, argv: list[str], user: str) -> tuple[int | None, str]:
        created = self.client.api.exec_create(self.id, argv, stdout=True, stderr=True, user=user)
        output = self.client.api.exec_start(created["Id"])
        code = self.client.api.exec_inspect(created["Id"]).get("ExitCode")
        return code, output.decode("utf-8", errors="replace") if isinstance(output, bytes) else ""

    def exit_code(self, exec_id: str) -> int | None:
        deadline = time.monotonic() + 5
        while True:
            info = self.client.api.exec_inspect(exec_id)
            if not info.get("Running") and info.get("ExitCode") is not None:
                return int(info["ExitCode"])
            if time.monotonic() > deadline:
                return None
            time.sleep(0.005)

    def running(self) -> list[int]:
        uid = self.user.partition(":")[0]
        code, out = self.exec_output(["/bin/sh", "-c", LIST, "list", uid], KEEPER_USER)
        return sorted(int(p) for p in out.split() if p.isdigit()) if code == 0 else []

    def alive(self) -> bool:
        try:
            self.container.reload()
        except docker.errors.NotFound:
            return False
        return bool(self.container.attrs.get("State", {}).get("Running"))

    def _events(self, names: tuple[str, ...]) -> list[dict[str, Any]]:
        """This container's events of these kinds since it started ("remove" is Podman's "destroy")."""
        if traits(self.client).podman:
            # Podman 4.3 matches a container by its short id only, ignores the event filter, and
            # reads a fractional `until` as no events at all: the next whole second it is.
            until: Any = math.ceil(time.time())
            filters: dict[str, Any] = {"container": self.id[:12]}
        else:
            # A fractional `until` ends the query now; an int would block to the next second.
            until = f"{time.time():.6f}"
            filters = {"container": self.id, "event": list(names)}
        stream = self.client.api.events(since=int(self.started) - 1, until=until, decode=True, filters=filters)
        with contextlib.closing(stream):  # else its socket is left for the garbage collector
            found = [event for event in stream if _action(event) in names]
        return found

    def events(self, *names: str) -> set[str]:
        """Which of these container events the daemon logged since the container started."""
        return {_action(event) for event in self._events(names)}

    def death(self) -> tuple[set[str], int | None] | None:
        """Why a warm container's agent went away: the events seen and its exit code.

        ``None`` while it still runs (after a few seconds of waiting for it to stop).
        """
        deadline = time.monotonic() + 5
        while self.alive():
            if time.monotonic() > deadline:
                return None
            time.sleep(0.02)
        seen: set[str] = set()
        code: int | None = None
        # The daemon logs its events a moment after the state changes: a container already seen
        # stopped may not have its "die" on record yet (CI saw no events at all, once).
        deadline = time.monotonic() + 2
        while True:
            for event in self._events(OUTSIDE_EVENTS):
                action = _action(event)
                seen.add(action)
                exit_code = (event.get("Actor") or {}).get("Attributes", {}).get("exitCode")
                if action == "die" and exit_code is not None:
                    code = int(exit_code)
            if "die" in seen or time.monotonic() > deadline:
                return seen, code
            time.sleep(0.05)

    def killed_from_outside(self) -> tuple[bool, bool]:
        """(killed, out of memory): `docker kill`/stop, an OOM of its init, a daemon restart."""
        seen = self.events(*OUTSIDE_EVENTS)
        killed = bool(seen - {"oom"}) or not self.alive()
        return killed, "oom" in seen

    def kill(self) -> None:
        """SIGKILL the container's init and wait until it is no longer running."""
        with contextlib.suppress(docker.errors.NotFound):
            try:
                self.container.kill()
            except docker.errors.APIError as exc:
                if exc.status_code != 409:  # 409: not running any more
                    raise
            self.client.api.wait(self.id, condition="not-running")
        self.removed = True

    def remove(self) -> None:
        self.removed = True
        remove_container(self.client, self.id)


REMOVE_TRIES = 5


def remove_container(client: docker.DockerClient, cid: str) -> None:
    """Force-remove one container (see ``remove_by_id``), again while Podman reports a race.

    Podman (4.3) answers a force-remove that meets the container stopping, or its own auto-remove
    under way, with a 500 "container state improper" where dockerd says 409 or removes it; asked
    again a moment later, it removes the container or finds it gone.
    """
    for attempt in range(REMOVE_TRIES):
        try:
            remove_by_id(client, cid)
            return
        except docker.errors.APIError as exc:
            if attempt + 1 == REMOVE_TRIES or "container state improper" not in str(exc.explanation or exc):
                raise
        time.sleep(0.05 * (attempt + 1))
