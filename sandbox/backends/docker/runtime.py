"""One running container and the blocking operations on it (run them in a worker thread).

Both process models drive their containers through :class:`Runtime`: create and start (attached
first, for the warm agent), exec, list the command uid's processes, read the daemon's events to
tell why a container died, kill, remove.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import docker
import docker.errors

from sandbox.backends.docker.client import quietly, remove_by_id
from sandbox.backends.docker.config import KEEPER_USER

if TYPE_CHECKING:
    from docker.models.containers import Container

# PID 1 is the agent of a warm container (the command uid too) or tini: never the call's.
LIST = "ps -u \"$1\" -o pid=,stat= | awk '$1 != 1 && $2 !~ /^Z/ {print $1}'"


@dataclass
class Runtime:
    """One running container and the blocking operations on it (run them in a worker thread)."""

    client: docker.DockerClient
    container: Container
    user: str
    started: float = field(default_factory=time.time)
    oom_kills: int = 0
    removed: bool = False

    @property
    def id(self) -> str:
        return str(self.container.id)

    @classmethod
    def create(cls, client: docker.DockerClient, config: dict[str, Any], user: str) -> Runtime:
        container = client.containers.create(**config)
        with contextlib.ExitStack() as cleanup_on_fail:
            cleanup_on_fail.callback(quietly, lambda: container.remove(force=True))
            container.start()
            cleanup_on_fail.pop_all()
        return cls(client, container, user)

    @classmethod
    def create_attached(cls, client: docker.DockerClient, config: dict[str, Any], user: str) -> tuple[Runtime, Any]:
        """Create, attach (before start: nothing the agent says is missed), start."""
        container = client.containers.create(**config)
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
            argv,
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

    def events(self, *names: str) -> set[str]:
        """Which of these container events the daemon logged since the container started."""
        # A fractional `until` ends the query now; an int would block to the next second.
        until: Any = f"{time.time():.6f}"
        stream = self.client.api.events(
            since=int(self.started) - 1, until=until, decode=True, filters={"container": self.id, "event": list(names)}
        )
        with contextlib.closing(stream):  # else its socket is left for the garbage collector
            return {str(event.get("status") or event.get("Action")) for event in stream}

    def death(self) -> tuple[set[str], int | None] | None:
        """Why a warm container's agent went away: the events seen and its exit code.

        ``None`` while it still runs (after a few seconds of waiting for it to stop).
        """
        deadline = time.monotonic() + 5
        while self.alive():
            if time.monotonic() > deadline:
                return None
            time.sleep(0.02)
        until: Any = f"{time.time():.6f}"
        stream = self.client.api.events(
            since=int(self.started) - 1,
            until=until,
            decode=True,
            filters={"container": self.id, "event": ["kill", "die", "stop", "destroy", "oom"]},
        )
        seen: set[str] = set()
        code: int | None = None
        with contextlib.closing(stream):
            for event in stream:
                action = str(event.get("status") or event.get("Action"))
                seen.add(action)
                exit_code = (event.get("Actor") or {}).get("Attributes", {}).get("exitCode")
                if action == "die" and exit_code is not None:
                    code = int(exit_code)
        return seen, code

    def killed_from_outside(self) -> tuple[bool, bool]:
        """(killed, out of memory): `docker kill`/stop, an OOM of its init, a daemon restart."""
        seen = self.events("kill", "die", "stop", "destroy", "oom")
        killed = bool(seen & {"kill", "die", "stop", "destroy"}) or not self.alive()
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
        remove_by_id(self.client, self.id)
