"""The Docker jail: a container per session (warm) or per call, through the docker SDK only.

**Warm containers** (``lifecycle = "session"``) run one process of ours: the agent of
:mod:`sandbox.backends.docker_agent`, as PID 1 and as the command uid, its stdin open. We attach
to the container once (before starting it) and keep that stream for the jail's life: requests go
to the agent's stdin as JSON lines, its replies come back as binary frames (the command's stdout
and stderr as they arrive, then its exit status). A call therefore costs no ``docker exec`` (runc
sets up each one in tens of milliseconds), only a fork in the container. The agent starts each
command in a session of its own and, once the command exited or on a kill request (TERM, the
grace, KILL), sends ``kill(-1, SIGKILL)`` until ``/proc`` shows no other process of its uid: the
tree kill, setsid'd, double-forked and TERM-ignoring processes included. Only then does it report
the exit, so nothing of a call survives into the next; calls are serialised for that reason.
Being PID 1 of the pid namespace, the agent gets no signal from inside it that it has no handler
for (SIGKILL included); it is non-dumpable, so the same uid can neither ptrace it nor open its
``/proc/1/fd`` pipes. Should it die anyway (an OOM kill, ``docker kill``), the stream ends: the
call fails with BACKEND_UNAVAILABLE saying why, and the next call gets a new container. Our
socket closing (the executor died) closes the agent's stdin (StdinOnce), which ends the
container; auto-remove deletes it. Per-call OOM kills are the agent's reading of the memory
cgroup's ``oom_kill`` count before and after the call.

**Per-call containers** (``lifecycle = "call"``) keep exec-per-call: tini runs ``sleep infinity``
as a *keeper* uid (65534), the call is one ``docker exec`` as the command uid, wrapped so that
``kill -KILL -1`` removes whatever it left behind, and the container is removed afterwards.

Blocking SDK calls run in worker threads; output is read from hijacked sockets in dedicated
threads that feed two memory streams as frames arrive. No ``docker.errors.*`` and no
``requests`` error crosses a public call: :func:`_translated` maps them to our tree.
"""

from __future__ import annotations

import base64
import contextlib
import inspect
import json
import math
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread
import docker
import docker.errors
import psutil
from anyio.abc import ByteReceiveStream
from docker.types import Mount, Ulimit
from docker.utils.socket import frames_iter

from sandbox import __version__
from sandbox.backends import docker_agent
from sandbox.backends.base import Backend, Jail, Process
from sandbox.backends.environment import SANDBOX_GID, SANDBOX_HOME, SANDBOX_UID, base_env, host_files
from sandbox.calls import check_workspace
from sandbox.errors import BackendUnavailable, InvalidArgument, SandboxError, map_errors
from sandbox.guarantees import Report
from sandbox.image import build_command
from sandbox.mounts import CopyTree

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
    from pathlib import Path

    from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
    from docker.models.containers import Container

    from sandbox.backends.base import Stdin
    from sandbox.profile import Profile

T = TypeVar("T")

IMAGE_REPOSITORY = "sandbox-runtime"
DEFAULT_IMAGE = f"{IMAGE_REPOSITORY}:{__version__}"
KEEPER_USER = "65534:65534"
API_TIMEOUT_S = 30  # every SDK request; a dead daemon fails at once, a wedged one after this
PROBE_TIMEOUT_S = 3
LABEL_OWNER = "sandbox.owner"  # <pid>@<host>
LABEL_OWNER_STARTED = "sandbox.owner-started"  # the owner's start time, against pid reuse
LABEL_JAIL = "sandbox.jail"
LABEL_LIFECYCLE = "sandbox.lifecycle"
LABEL_VERSION = "sandbox.version"
IMAGE_VERSION_LABEL = "sandbox.image.version"
STDOUT, STDERR = 1, 2
BUFFERED_CHUNKS = 64
AGENT_SOURCE = inspect.getsource(docker_agent)
AGENT_HEADER = docker_agent.HEADER
STDIN_CHUNK = 1 << 16
STDIN_WINDOW = 1 << 20  # stdin bytes in flight to a warm container's agent
KILL_WAIT_S = 10  # beyond the grace: an agent this late is wedged, and its container is removed
DIAGNOSTICS = 4096  # the tail of the agent's own stderr kept for error messages

# Kills whatever an earlier call might have left, runs the command, then kills whatever it left
# behind (kill is a shell builtin: no fork, and kill -1 spares the shell itself).
WRAPPER = 'kill -KILL -1 2>/dev/null; mkdir -p "$HOME" 2>/dev/null; "$@"; rc=$?; kill -KILL -1 2>/dev/null; exit $rc'
# Execute-only copy of dash in the image: non-dumpable, so the call cannot ptrace its wrapper.
WRAPPER_SHELL = "/usr/local/bin/sandbox-sh"

# TERM, up to $1 ticks of grace, KILL until ps shows nothing of this uid but the sweep itself;
# then the memory cgroup's oom_kill count (v1 or v2 file, whichever the container shows).
SWEEP = r"""
u=$(id -u); ticks=$1
others() {
  ps -u "$u" -o pid=,ppid=,stat= | awk -v me=$$ '$1 != me && $2 != me && $3 !~ /^Z/ {f=1} END {exit !f}'
}
if [ "$ticks" -gt 0 ]; then
  kill -TERM -1 2>/dev/null
  i=0; while [ "$i" -lt "$ticks" ] && others; do sleep 0.02; i=$((i+1)); done
fi
n=0
while others; do
  kill -KILL -1 2>/dev/null; n=$((n+1)); [ "$n" -gt 400 ] && exit 3; sleep 0.005
done
cat /sys/fs/cgroup/memory/memory.oom_control /sys/fs/cgroup/memory.events 2>/dev/null \
  | awk '$1 == "oom_kill" {print "oom_kill", $2; exit}'
exit 0
"""
# PID 1 is the agent of a warm container (the command uid too) or tini: never the call's.
LIST = "ps -u \"$1\" -o pid=,stat= | awk '$1 != 1 && $2 !~ /^Z/ {print $1}'"


# ------------------------------------------------------------------------------ errors, client


@contextlib.contextmanager
def _translated(what: str) -> Iterator[None]:
    """docker.errors.* and connection errors -> BACKEND_UNAVAILABLE, with what we were doing."""
    try:
        yield
    except SandboxError:
        raise
    except docker.errors.APIError as exc:
        raise BackendUnavailable(f"{what}: {exc.explanation or exc}", backend="docker", status=exc.status_code) from exc
    except (docker.errors.DockerException, OSError) as exc:  # requests' errors are OSErrors
        raise BackendUnavailable(f"{what}: the Docker daemon is unreachable ({_short(exc)})", backend="docker") from exc


def _short(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0][:200]


def _check_unix_socket() -> None:
    """Fail fast, and without the SDK, when a local daemon's socket does not answer.

    The SDK leaks the socket of a failed unix connect; trying it ourselves first avoids that.
    """
    host = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    if not host.startswith("unix://"):
        return
    path = host.removeprefix("unix://")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe_sock:
        probe_sock.settimeout(PROBE_TIMEOUT_S)
        try:
            probe_sock.connect(path)
        except OSError as exc:
            raise BackendUnavailable(
                f"cannot reach the Docker daemon: the Docker daemon is unreachable at {path} "
                f"({exc.strerror or exc}); start dockerd or set DOCKER_HOST",
                backend="docker",
                host=host,
            ) from None


def connect(timeout: float = API_TIMEOUT_S) -> docker.DockerClient:
    """A client from the usual environment (DOCKER_HOST, DOCKER_TLS_VERIFY, DOCKER_CERT_PATH)."""
    _check_unix_socket()
    with _translated("cannot reach the Docker daemon"):
        client = docker.from_env(timeout=int(math.ceil(timeout)))
        try:
            client.ping()
        except BaseException:
            client.close()
            raise
    return client


async def _run_sync(what: str, func: Callable[..., T], *args: Any) -> T:
    def call() -> T:
        with _translated(what):
            return func(*args)

    return await anyio.to_thread.run_sync(call)


def image_ref(profile: Profile) -> str:
    return profile.docker.image or DEFAULT_IMAGE


def check_image(client: docker.DockerClient, ref: str) -> None:
    """Refuse a missing image (say how to build it) or one built for another version."""
    try:
        with _translated(f"cannot inspect image {ref}"):
            labels = client.images.get(ref).labels or {}
    except BackendUnavailable as exc:
        if exc.data.get("status") != 404:
            raise
        raise BackendUnavailable(
            f"the sandbox image {ref} is not on this Docker host: run `{build_command(ref)}` "
            "(`make image` in a checkout)",
            backend="docker",
            image=ref,
        ) from None
    found = labels.get(IMAGE_VERSION_LABEL)
    # Our image must match this version; a custom image is refused only if it says it is ours.
    if found != __version__ and (found is not None or ref == DEFAULT_IMAGE):
        raise BackendUnavailable(
            f"image {ref} was built for sandbox {found or 'unknown'}, this is {__version__}: "
            f"run `{build_command(ref)}` to rebuild it",
            backend="docker",
            image=ref,
            found=found,
            expected=__version__,
        )


# ------------------------------------------------------------------------------ container config


def owner_labels(jail_id: str, lifecycle: str) -> dict[str, str]:
    me = psutil.Process()
    return {
        LABEL_OWNER: f"{os.getpid()}@{socket.gethostname()}",
        LABEL_OWNER_STARTED: f"{me.create_time():.2f}",
        LABEL_JAIL: jail_id,
        LABEL_LIFECYCLE: lifecycle,
        LABEL_VERSION: __version__,
    }


def _ulimits(profile: Profile, agent: bool = False) -> list[Ulimit]:
    lim = profile.limits
    # CPU seconds count per process: the agent lives for the session, so it sets that limit on
    # each command it starts instead (the container's would kill the agent itself in time).
    cpu = None if agent else lim.cpu_time_s
    pairs = (("nofile", lim.nofile), ("fsize", lim.file_size), ("cpu", cpu))
    return [Ulimit(name=name, soft=int(value), hard=int(value)) for name, value in pairs if value is not None]


def _resources(profile: Profile, agent: bool = False) -> dict[str, Any]:
    lim = profile.limits
    res: dict[str, Any] = {"ulimits": _ulimits(profile, agent)}
    if lim.memory is not None:
        # Swap equal to memory: no swap at all, so a memory bomb meets the limit, not the disk.
        res.update(mem_limit=lim.memory, memswap_limit=lim.memory)
    if lim.pids is not None:
        res["pids_limit"] = lim.pids
    if lim.cpus is not None:
        res["nano_cpus"] = int(lim.cpus * 1e9)
    return res


def _tmpfs(profile: Profile, home_owner: str | None = None) -> dict[str, str]:
    size = f",size={profile.limits.tmp_size}" if profile.limits.tmp_size else ""
    tmpfs = {"/tmp": f"rw,nosuid,nodev,mode=1777{size}"}
    if home_owner is not None:
        # Docker makes the mount points of host files as root: the home must stay the command user's.
        uid, gid = _uid_gid(home_owner)
        tmpfs[SANDBOX_HOME] = f"rw,nosuid,nodev,mode=0755,uid={uid},gid={gid}{size}"
    return tmpfs


def container_config(
    profile: Profile,
    jail_id: str,
    workspace: Path,
    source: Path,
    scratch: Path | None = None,
    agent_user: str | None = None,
) -> dict[str, Any]:
    """The create() arguments of a jail's container: every confinement knob in one place.

    The Docker socket is never mounted; the binds are the workspace (or its private copy), at
    the workspace's own absolute path, and the profile's ``env.files``, read-only in the jail's
    home (which then gets a tmpfs of its own, owned by the command user). With ``agent_user``
    the container's only process is the agent (see :mod:`sandbox.backends.docker_agent`), running
    as that uid with stdin open; without, it is tini and ``sleep infinity`` as the keeper uid, for exec-per-call.
    """
    ws = str(workspace)
    mounts = [Mount(target=ws, source=str(source), type="bind", read_only=profile.mount.strategy == "ro")]
    if scratch is not None:
        mounts.append(Mount(target=str(scratch), source=str(scratch), type="bind"))
    files = host_files(profile)
    mounts += [Mount(target=target, source=source, type="bind", read_only=True) for source, target in files]
    config: dict[str, Any] = {
        "image": image_ref(profile),
        "command": ["sleep", "infinity"],
        "user": KEEPER_USER,
        "labels": owner_labels(jail_id, profile.docker.lifecycle),
        "detach": True,
        "hostname": "sandbox",
        "network_mode": "bridge" if profile.network.mode == "host" else "none",
        "read_only": True,
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges"],  # Docker's default seccomp profile stays on
        "tmpfs": _tmpfs(profile, exec_user(profile, workspace) if files else None),
        "mounts": mounts,
        "working_dir": ws,
        "environment": {},
        # The daemon removes it by itself if it dies with us or is restarted without us.
        "auto_remove": True,
        **_resources(profile, agent_user is not None),
    }
    if agent_user is not None:
        cpu = profile.limits.cpu_time_s
        # detach=False with stdin_open: stdin is attachable and closed when we detach (StdinOnce),
        # so the agent ends the container if the executor dies.
        config.update(
            entrypoint=["python3"],
            user=agent_user,
            stdin_open=True,
            detach=False,
            command=["-I", "-S", "-c", AGENT_SOURCE, "" if cpu is None else str(cpu)],
        )
    return config


def exec_user(profile: Profile, workspace: Path) -> str:
    """The uid:gid commands run as: the workspace owner's, so files stay theirs.

    A root-owned workspace (the caller is root) gets the profile's user instead (1000:1000 by
    default): the jail never runs commands as uid 0.
    """
    if profile.docker.user != f"{SANDBOX_UID}:{SANDBOX_GID}":
        return profile.docker.user
    st = workspace.stat()
    if st.st_uid == 0:
        return profile.docker.user
    return f"{st.st_uid}:{st.st_gid}"


def _uid_gid(user: str) -> tuple[int, int]:
    uid, _, gid = user.partition(":")
    try:
        return int(uid), int(gid or uid)
    except ValueError:
        raise InvalidArgument(f"docker.user must be numeric uid:gid, got {user!r}", user=user) from None


# ------------------------------------------------------------------------------ streams


class _ChunkStream(ByteReceiveStream):
    """A memory object stream of byte chunks seen as a byte stream."""

    def __init__(self, receive: MemoryObjectReceiveStream[bytes]) -> None:
        self._receive = receive
        self._pending = b""

    async def receive(self, max_bytes: int = 65536) -> bytes:
        if not self._pending:
            self._pending = await self._receive.receive()  # EndOfStream ends the byte stream too
        chunk, self._pending = self._pending[:max_bytes], self._pending[max_bytes:]
        return chunk

    async def aclose(self) -> None:
        self._receive.close()

    def close(self) -> None:
        self._receive.close()


def _unwrap_socket(sock: Any) -> socket.socket | None:
    raw = getattr(sock, "_sock", sock)
    return raw if isinstance(raw, socket.socket) else None


class _Pump:
    """Reads one exec's multiplexed output in a thread and forwards it frame by frame."""

    def __init__(self, sock: Any) -> None:
        self.sock = sock
        out_send, out_recv = anyio.create_memory_object_stream[bytes](BUFFERED_CHUNKS)
        err_send, err_recv = anyio.create_memory_object_stream[bytes](BUFFERED_CHUNKS)
        self._sends: dict[int, MemoryObjectSendStream[bytes]] = {STDOUT: out_send, STDERR: err_send}
        self.stdout, self.stderr = _ChunkStream(out_recv), _ChunkStream(err_recv)
        self.done = anyio.Event()
        self.error: BaseException | None = None
        self._token = anyio.lowlevel.current_token()
        raw = _unwrap_socket(sock)
        if raw is not None:
            raw.settimeout(None)  # a silent command is not a dead daemon; close() unblocks us
        threading.Thread(target=self._run, name="docker-exec-pump", daemon=True).start()

    def _run(self) -> None:
        try:
            for stream_id, data in frames_iter(self.sock, tty=False):  # type: ignore[no-untyped-call]
                self._forward(self._sends.get(stream_id, self._sends[STDERR]), data)
        except (OSError, ValueError) as exc:  # the daemon died or we closed the socket
            self.error = exc
        finally:
            with contextlib.suppress(RuntimeError):  # the event loop is gone
                for send in self._sends.values():
                    anyio.from_thread.run_sync(send.close, token=self._token)
                anyio.from_thread.run_sync(self.done.set, token=self._token)

    def _forward(self, send: MemoryObjectSendStream[bytes], data: bytes) -> None:
        # Blocks while the buffer is full: back-pressure to the daemon, memory stays bounded.
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
            anyio.from_thread.run(send.send, data, token=self._token)

    def feed(self, data: bytes) -> None:
        """Write the call's stdin and half-close it, so the command sees end of file."""
        raw = _unwrap_socket(self.sock)
        if raw is None:
            raise BackendUnavailable("this Docker connection cannot carry stdin", backend="docker")
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            raw.sendall(data)
        with contextlib.suppress(OSError):
            raw.shutdown(socket.SHUT_WR)

    async def stream(self, source: ByteReceiveStream) -> None:
        """Copy a stream to the call's stdin as it arrives (no thread: MSG_DONTWAIT), then half-close."""
        raw = _unwrap_socket(self.sock)
        if raw is None:
            raise BackendUnavailable("this Docker connection cannot carry stdin", backend="docker")
        try:
            async for chunk in source:
                view = memoryview(chunk)
                while view:
                    try:
                        view = view[raw.send(view, socket.MSG_DONTWAIT) :]
                    except BlockingIOError:
                        await anyio.wait_writable(raw)
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            with contextlib.suppress(OSError):
                raw.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.stdout.close()
        self.stderr.close()
        raw = _unwrap_socket(self.sock)
        with contextlib.suppress(OSError):
            if raw is not None:
                raw.shutdown(socket.SHUT_RDWR)
            self.sock.close()
            if raw is not None:
                raw.close()


# ------------------------------------------------------------------------------ one container


@dataclass
class Sweep:
    ok: bool
    oom_kills: int | None = None
    detail: str = ""


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
        try:
            container.start()
        except BaseException:
            with contextlib.suppress(docker.errors.DockerException, OSError):
                container.remove(force=True)
            raise
        return cls(client, container, user)

    @classmethod
    def create_attached(cls, client: docker.DockerClient, config: dict[str, Any], user: str) -> tuple[Runtime, Any]:
        """Create, attach (before start: nothing the agent says is missed), start."""
        container = client.containers.create(**config)
        sock: Any = None
        try:
            sock = client.api.attach_socket(
                str(container.id), params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1}
            )
            container.start()
        except BaseException:
            with contextlib.suppress(docker.errors.DockerException, OSError):
                if sock is not None:
                    sock.close()
                container.remove(force=True)
            raise
        return cls(client, container, user), sock

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

    def sweep(self, grace: float) -> Sweep:
        ticks = math.ceil(grace / 0.02) if grace > 0 else 0
        code, out = self.exec_output(["/bin/sh", "-c", SWEEP, "sweep", str(ticks)], self.user)
        if code != 0:
            return Sweep(False, detail=f"sweep exit {code}: {out.strip()[:200]}")
        counts = [int(line.split()[1]) for line in out.splitlines() if line.startswith("oom_kill ")]
        return Sweep(True, counts[0] if counts else None)

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
        _remove_by_id(self.client, self.id)


# ------------------------------------------------------------------------------ process


class DockerProcess(Process):
    """One call of a per-call container: an exec there; killed by sweeping its uid out, then removing it."""

    def __init__(self, runtime: Runtime, exec_id: str, pump: _Pump, on_done: Callable[[DockerProcess], None]) -> None:
        self.runtime = runtime
        self.exec_id = exec_id
        self._pump = pump
        self.stdout = pump.stdout
        self.stderr = pump.stderr
        self._on_done = on_done
        self._oom_before = runtime.oom_kills
        self._oom = False
        self._swept = False
        self._killing = False
        self.stdin_data: Stdin = None
        self.returncode: int | None = None

    async def feed_stdin(self) -> None:
        if self.stdin_data is None or isinstance(self.stdin_data, bytes):
            await _run_sync("cannot write the call's stdin", self._pump.feed, self.stdin_data or b"")
        else:
            await self._pump.stream(self.stdin_data)

    async def wait(self) -> int:
        if self.returncode is not None:
            return self.returncode
        await self._pump.done.wait()
        if self._killing and self._swept:
            # We removed its container (timeout, abort): the exec's status went with it.
            self.returncode = -9
            return self.returncode
        code = await _run_sync("cannot read the call's exit status", self.runtime.exit_code, self.exec_id)
        if code is None:
            raise BackendUnavailable(
                "the Docker daemon stopped answering during the call", backend="docker", container=self.runtime.id
            )
        if code == 137 and not self._killing:
            await self._check_container(code)
        self.returncode = code
        return code

    async def _check_container(self, code: int) -> None:
        """An exit by SIGKILL we did not send: was the whole container killed from outside?"""
        killed, oom = await _run_sync("cannot inspect the container", self.runtime.killed_from_outside)
        if not killed:
            return
        self._oom = oom
        self.runtime.removed = True  # auto-remove takes it away; the next call gets a new one
        self._swept = True  # nothing is left: the container is gone
        raise BackendUnavailable(
            f"the container {self.runtime.id[:12]} was killed from outside "
            f"({'out of memory' if oom else 'docker kill or stop'}); the call's exit status was {code}",
            backend="docker",
            container=self.runtime.id,
            exit_code=code,
            oom_killed=oom,
        )

    async def kill_tree(self, grace: float) -> None:
        if self._swept:
            return
        self._killing = True
        with anyio.CancelScope(shield=True):
            await self._sweep(grace)

    async def _sweep(self, grace: float) -> None:
        if grace == 0 and self.returncode != 137:
            # This call's own container: stopping its init kills everything in its pid
            # namespace; the daemon then deletes it by itself (auto-remove), off our clock.
            await _run_sync("cannot stop the call's container", self.runtime.kill)
            self._swept = True
            self._finish()
            return
        try:
            result = await _run_sync("cannot kill the call's processes", self.runtime.sweep, grace)
        except BackendUnavailable:
            if not await self._container_gone():
                raise
            result = Sweep(True)
        if result.oom_kills is not None:
            self._oom = result.oom_kills > self._oom_before
            self.runtime.oom_kills = result.oom_kills
        # The container is this call's alone: removing it kills everything in its pid namespace.
        await _run_sync("cannot remove the call's container", self.runtime.remove)
        self._swept = True
        self._finish()

    async def _container_gone(self) -> bool:
        with contextlib.suppress(BackendUnavailable):
            return not await _run_sync("cannot inspect the container", self.runtime.alive)
        return False

    def running_pids(self) -> list[int]:
        if self._swept:
            return []
        with contextlib.suppress(docker.errors.DockerException, OSError):
            return self.runtime.running()
        return []

    def oom_killed(self) -> bool:
        return self._oom

    def release(self) -> None:
        self._pump.close()
        if not self._swept:
            threading.Thread(target=_quietly, args=(self.runtime.remove,), daemon=True).start()
        self._finish()

    def _finish(self) -> None:
        self._on_done(self)


async def _in_chunks(data: bytes) -> AsyncIterator[bytes]:
    yield data


def _quietly(func: Callable[[], None]) -> None:
    with contextlib.suppress(docker.errors.DockerException, OSError):
        func()


# ------------------------------------------------------------------------------ the agent's link


class _AgentLink:
    """A warm container's attach stream: requests to its agent, the agent's frames back.

    One thread reads the multiplexed stream for the jail's life and routes each frame to its
    call's streams; a full stream blocks it (back-pressure through the daemon to the agent,
    which then stops reading the command's pipes). Requests are written from worker threads.
    """

    def __init__(self, sock: Any) -> None:
        self.sock = sock
        raw = _unwrap_socket(sock)
        if raw is None:
            raise BackendUnavailable("this Docker connection cannot carry the agent's requests", backend="docker")
        raw.settimeout(None)  # an idle session is not a dead daemon; close() unblocks the reader
        self._raw = raw
        self.calls: dict[int, AgentProcess] = {}
        self.dead = False
        self.retired = False
        self.error: BaseException | None = None
        self.diagnostics = b""
        self._lock = threading.Lock()
        self._ids = iter(range(1, 1 << 31))
        self._token = anyio.lowlevel.current_token()
        threading.Thread(target=self._run, name="docker-agent-link", daemon=True).start()

    def next_id(self) -> int:
        return next(self._ids)

    def send(self, message: dict[str, Any]) -> None:
        """Write one request (blocking: call from a worker thread)."""
        line = json.dumps(message, separators=(",", ":")).encode() + b"\n"
        with self._lock:
            self._raw.sendall(line)

    def _run(self) -> None:
        buffer = bytearray()
        try:
            for stream_id, data in frames_iter(self.sock, tty=False):  # type: ignore[no-untyped-call]
                if stream_id == STDOUT:
                    buffer += data
                    self._parse(buffer)
                else:
                    self.diagnostics = (self.diagnostics + data)[-DIAGNOSTICS:]
        except (OSError, ValueError) as exc:  # the daemon died or we closed the socket
            self.error = exc
        finally:
            self.dead = True
            for proc in self.calls.copy().values():  # copy(): atomic, the loop may forget one meanwhile
                with contextlib.suppress(RuntimeError):  # the event loop is gone
                    anyio.from_thread.run_sync(proc.lost, token=self._token)

    def _parse(self, buffer: bytearray) -> None:
        size = AGENT_HEADER.size
        while len(buffer) >= size:
            kind, cid, length = AGENT_HEADER.unpack_from(buffer)
            if len(buffer) < size + length:
                return
            payload = bytes(buffer[size : size + length])
            del buffer[: size + length]
            proc = self.calls.get(cid)
            if proc is not None:
                proc.frame(kind, payload)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._raw.shutdown(socket.SHUT_RDWR)
            self.sock.close()
            self._raw.close()


class AgentProcess(Process):
    """One call in a warm container, started and swept by the agent (see docker_agent)."""

    def __init__(self, jail: DockerJail, runtime: Runtime, link: _AgentLink, stdin: Stdin) -> None:
        self.runtime = runtime
        self._jail = jail
        self._link = link
        self.id = link.next_id()
        self._stdin = stdin
        out_send, out_recv = anyio.create_memory_object_stream[bytes](BUFFERED_CHUNKS)
        err_send, err_recv = anyio.create_memory_object_stream[bytes](BUFFERED_CHUNKS)
        self._sends: dict[bytes, MemoryObjectSendStream[bytes]] = {b"o": out_send, b"e": err_send}
        self._out, self._err = _ChunkStream(out_recv), _ChunkStream(err_recv)
        self.stdout, self.stderr = self._out, self._err
        self._token = anyio.lowlevel.current_token()
        self._exited = anyio.Event()
        self._result: dict[str, Any] | None = None
        self._refused: str | None = None
        self._lost = False
        self._draining = False  # killing: output nobody may read any more is dropped, not waited on
        self._blocked: anyio.CancelScope | None = None
        self._released = False
        self._unacked = 0  # stdin bytes sent that the agent has not yet passed on (or dropped)
        self._credit = anyio.Event()
        self.returncode: int | None = None
        link.calls[self.id] = self

    @property
    def finished(self) -> bool:
        return self._exited.is_set()

    # -- from the link's reader thread

    def frame(self, kind: bytes, payload: bytes) -> None:
        with contextlib.suppress(RuntimeError):  # the event loop is gone
            if kind in self._sends:
                anyio.from_thread.run(self._deliver, self._sends[kind], payload, token=self._token)
            elif kind == b"x":
                anyio.from_thread.run_sync(self._exit, json.loads(payload), token=self._token)
            elif kind == b"i":
                anyio.from_thread.run_sync(self._credited, int(payload), token=self._token)
            elif kind == b"!":
                self._refused = payload.decode(errors="replace")
                anyio.from_thread.run_sync(self._end, token=self._token)

    async def _deliver(self, send: MemoryObjectSendStream[bytes], data: bytes) -> None:
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.WouldBlock):
            if self._draining:
                send.send_nowait(data)
                return
            with anyio.CancelScope() as scope:
                self._blocked = scope
                try:
                    await send.send(data)  # blocks while the buffer is full: memory stays bounded
                finally:
                    self._blocked = None

    def _exit(self, result: dict[str, Any]) -> None:
        self._result = result
        if result.get("retire"):
            self._link.retired = True  # the call tampered with the agent: the next one gets a new container
        self._end()

    def lost(self) -> None:
        self._lost = True
        self._end()

    def _credited(self, count: int) -> None:
        self._unacked -= count
        self._credit.set()
        self._credit = anyio.Event()

    def _end(self) -> None:
        for send in self._sends.values():
            send.close()
        self._exited.set()
        self._credit.set()

    # -- the Process interface

    async def feed_stdin(self) -> None:
        # At most STDIN_WINDOW bytes ride between us and the command: the agent credits what it
        # passed on, so its buffer stays bounded and a kill request never waits behind stdin.
        source = self._stdin or b""
        chunks = _in_chunks(source) if isinstance(source, bytes) else source
        async for data in chunks:
            for start in range(0, len(data), STDIN_CHUNK):
                while self._unacked >= STDIN_WINDOW and not self.finished:
                    await self._credit.wait()
                if self.finished:
                    return
                piece = data[start : start + STDIN_CHUNK]
                self._unacked += len(piece)
                await self._request({"op": "stdin", "id": self.id, "data": base64.b64encode(piece).decode()})
        await self._request({"op": "eof", "id": self.id})

    async def _request(self, message: dict[str, Any]) -> None:
        if self._link.dead:
            return  # wait() tells what happened
        await _run_sync("cannot write to the container's agent", self._link.send, message)

    async def wait(self) -> int:
        await self._exited.wait()
        if self._result is not None:
            code = self._result.get("code")
            if not isinstance(code, int):
                raise BackendUnavailable(
                    "the container's agent reported no exit status", backend="docker", container=self.runtime.id
                )
            self.returncode = code
            return code
        if self._refused is not None:
            raise BackendUnavailable(
                f"the container's agent refused the call: {self._refused}", backend="docker", container=self.runtime.id
            )
        await self._jail.agent_lost(self)
        raise AssertionError("unreachable")  # agent_lost always raises

    async def kill_tree(self, grace: float) -> None:
        if self.finished and not self._lost:
            return
        self._draining = True
        if self._blocked is not None:
            self._blocked.cancel()
        with anyio.CancelScope(shield=True):
            if self._lost or self._link.dead:
                await self._jail.discard(self.runtime)
                return
            await _run_sync(
                "cannot ask the container's agent to kill the call",
                self._link.send,
                {"op": "kill", "id": self.id, "grace": grace},
            )
            with anyio.move_on_after(grace + KILL_WAIT_S):
                await self._exited.wait()
            if not self.finished or self._lost:
                # A wedged agent, or one that died meanwhile: the container goes, and its processes.
                await self._jail.discard(self.runtime)

    def running_pids(self) -> list[int]:
        with contextlib.suppress(docker.errors.DockerException, OSError):
            return self.runtime.running()
        return []

    def oom_killed(self) -> bool:
        return bool(self._result and self._result.get("oom"))

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        self._draining = True
        self._out.close()
        self._err.close()
        if not self.finished and not self._link.dead:
            # Never waited for (a jail closing, a failed caller): have the agent sweep it anyway;
            # the next call waits for that (DockerJail._ready_agent).
            message = {"op": "kill", "id": self.id, "grace": 0}
            threading.Thread(target=_quietly, args=(lambda: self._link.send(message),), daemon=True).start()
        self._jail.call_done(self)

    def forget(self) -> None:
        self._link.calls.pop(self.id, None)


# ------------------------------------------------------------------------------ jail


class DockerJail(Jail):
    backend = "docker"

    def __init__(
        self,
        client: docker.DockerClient,
        workspace: Path,
        profile: Profile,
        source: Path,
        tree: CopyTree | None,
        user: str,
        scratch: Path | None = None,
    ) -> None:
        self.client = client
        self.workspace = workspace
        self.profile = profile
        self.tree = tree
        self.user = user
        self.id = uuid.uuid4().hex[:12]
        self._config = container_config(
            profile, self.id, workspace, source, scratch, agent_user=user if self.warm else None
        )
        self._warm: Runtime | None = None
        self._link: _AgentLink | None = None
        self._slot = anyio.Semaphore(1)  # one call at a time in the warm container
        self._held: AgentProcess | None = None
        self._pending: AgentProcess | None = None  # released before its exit was reported
        self._live: set[DockerProcess] = set()
        self._closed = False

    @property
    def warm(self) -> bool:
        return self.profile.docker.lifecycle == "session"

    @property
    def container_id(self) -> str | None:
        return self._warm.id if self._warm else None

    async def start(self) -> None:
        if self.warm:
            await self._new_agent()

    async def _new_runtime(self) -> Runtime:
        return await _run_sync(
            "cannot start the jail's container", Runtime.create, self.client, self._config, self.user
        )

    async def _new_agent(self) -> Runtime:
        runtime, sock = await _run_sync(
            "cannot start the jail's container", Runtime.create_attached, self.client, self._config, self.user
        )
        try:
            self._link = _AgentLink(sock)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await _run_sync("cannot remove the container", runtime.remove)
            raise
        self._warm = runtime
        return runtime

    async def spawn(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: Stdin = None,
    ) -> Process:
        if self._closed:
            raise InvalidArgument("the jail is closed", jail=self.id)
        if not argv:
            raise InvalidArgument("empty argv: name a command to run")
        if not self.warm:
            runtime = await self._new_runtime()
            try:
                return await self._exec(runtime, argv, env, cwd, stdin)
            except BaseException:
                with anyio.CancelScope(shield=True):
                    await _run_sync("cannot remove the call's container", runtime.remove)
                raise
        await self._slot.acquire()
        try:
            proc = await self._run_in_agent(argv, env, cwd, stdin)
        except BaseException:
            self._slot.release()
            raise
        self._held = proc
        return proc

    async def _run_in_agent(
        self, argv: Sequence[str], env: Mapping[str, str] | None, cwd: str | None, stdin: Stdin
    ) -> AgentProcess:
        runtime, link = await self._ready_agent()
        proc = AgentProcess(self, runtime, link, stdin)
        request = {
            "op": "run",
            "id": proc.id,
            "argv": list(argv),
            "env": base_env(self.profile, env, workspace=self.workspace),
            "cwd": cwd or str(self.workspace),
            "stdin": stdin is not None,
        }
        try:
            await _run_sync("cannot start the command in the container", link.send, request)
        except BaseException:
            proc.forget()
            raise
        return proc

    async def _ready_agent(self) -> tuple[Runtime, _AgentLink]:
        """The warm container with its agent idle; a new one if it died, was removed or is wedged."""
        pending, self._pending = self._pending, None
        if pending is not None and not pending.finished:
            with anyio.move_on_after(KILL_WAIT_S):
                await pending._exited.wait()
            if not pending.finished and self._warm is not None:
                await self.discard(self._warm)
        if pending is not None:
            pending.forget()
        link = self._link
        if self._warm is not None and (self._warm.removed or link is None or link.dead or link.retired):
            await self.discard(self._warm)
        if self._warm is None or self._link is None:
            await self._new_agent()
        assert self._warm is not None and self._link is not None
        return self._warm, self._link

    async def discard(self, runtime: Runtime) -> None:
        """Remove a warm container we can no longer trust to be empty (its processes die with it)."""
        if self._warm is runtime:
            self._warm = None
            if self._link is not None:
                self._link.close()
                self._link = None
        if not runtime.removed:
            await _run_sync("cannot remove the container", runtime.remove)

    async def agent_lost(self, proc: AgentProcess) -> None:
        """The agent's stream ended mid-call: say why, structured, and never reuse the container."""
        runtime = proc.runtime
        diagnostics = proc._link.diagnostics.decode(errors="replace").strip()
        death = await _run_sync("the Docker daemon stopped answering during the call", runtime.death)
        if death is None:  # the stream broke but the container runs: we cannot drive it any more
            await self.discard(runtime)
            raise BackendUnavailable(
                "lost the connection to the container's agent during the call", backend="docker", container=runtime.id
            )
        runtime.removed = True  # auto-remove takes it away; the next call gets a new one
        await self.discard(runtime)
        seen, code = death
        oom = "oom" in seen
        if seen & {"kill", "stop"} or oom:
            what = "out of memory" if oom else "docker kill or stop"
            message = f"the container {runtime.id[:12]} was killed from outside ({what})"
        else:
            message = f"the container {runtime.id[:12]}'s agent died (exit status {code})"
            if diagnostics:
                message += f": {diagnostics.splitlines()[-1][:200]}"
        raise BackendUnavailable(
            f"{message}; the call's exit status is unknown",
            backend="docker",
            container=runtime.id,
            exit_code=code,
            oom_killed=oom,
        )

    def call_done(self, proc: AgentProcess) -> None:
        if not proc.finished:
            self._pending = proc
        else:
            proc.forget()
        if self._held is proc:
            self._held = None
            self._slot.release()

    async def _exec(
        self, runtime: Runtime, argv: Sequence[str], env: Mapping[str, str] | None, cwd: str | None, stdin: Stdin
    ) -> DockerProcess:
        cmd = [WRAPPER_SHELL, "-c", WRAPPER, "sandbox", *argv]
        exec_id, sock = await _run_sync(
            "cannot start the command in the container",
            runtime.exec_start,
            cmd,
            base_env(self.profile, env, workspace=self.workspace),
            cwd or str(self.workspace),
            stdin is not None,
        )
        proc = DockerProcess(runtime, exec_id, _Pump(sock), self._done)
        proc.stdin_data = stdin
        self._live.add(proc)
        return proc

    def _done(self, proc: DockerProcess) -> None:
        self._live.discard(proc)

    async def _shutdown(self) -> None:
        for proc in list(self._live):
            proc.release()
        if self._held is not None:
            self._held.release()
        # Removing the containers kills everything in them; the label catches any stray one.
        await anyio.to_thread.run_sync(_remove_jail_containers, self.client, self.id)
        if self._link is not None:
            self._link.close()
        self._warm = self._link = None
        self.client.close()


def _remove_jail_containers(client: docker.DockerClient, jail_id: str) -> None:
    """Force-remove every container of a jail; each one alone (auto-remove may race us)."""
    with contextlib.suppress(docker.errors.DockerException, OSError):
        # The low-level list: the high-level one inspects each container and trips on a vanished one.
        found = client.api.containers(all=True, filters={"label": f"{LABEL_JAIL}={jail_id}"})
        for row in found:
            _remove_by_id(client, str(row["Id"]))


def _remove_by_id(client: docker.DockerClient, cid: str) -> None:
    try:
        client.api.remove_container(cid, force=True)
    except docker.errors.NotFound:
        pass
    except docker.errors.APIError as exc:
        if exc.status_code != 409:  # 409: auto-remove is already removing it
            raise


# ------------------------------------------------------------------------------ backend


def _own_tree(tree: CopyTree, user: str) -> None:
    """Hand the private copy to the command uid (see ``CopyTree.hand_to``)."""
    with map_errors("cannot hand the private copy to the jail's user", BackendUnavailable):
        tree.hand_to(*_uid_gid(user))


def _own_dir(path: Path, user: str) -> None:
    """Hand the session's scratch directory (ours, not the user's) to the command uid."""
    uid, gid = _uid_gid(user)
    if os.geteuid() != 0 or path.stat().st_uid == uid:
        return
    with map_errors("cannot hand the scratch directory to the jail's user", BackendUnavailable):
        for dirpath, dirnames, filenames in os.walk(path):
            os.chown(dirpath, uid, gid)
            for name in dirnames + filenames:
                os.chown(os.path.join(dirpath, name), uid, gid, follow_symlinks=False)


class DockerBackend(Backend):
    name = "docker"

    def probe(self) -> Report:
        return probe()

    async def open_jail(self, workspace: Path, profile: Profile, *, scratch: Path | None = None) -> DockerJail:
        self.check(profile)
        ws = check_workspace(workspace)
        if profile.mount.strategy == "overlay":
            raise InvalidArgument("the docker backend has no overlay mount; use copy", backend="docker")
        user = exec_user(profile, ws)
        _uid_gid(user)
        host_files(profile)  # a refused env.files entry fails here, before a client or a copy exists
        client = await anyio.to_thread.run_sync(connect)
        try:
            await anyio.to_thread.run_sync(check_image, client, image_ref(profile))
            tree = await CopyTree.prepare(ws) if profile.mount.strategy == "copy" else None
        except BaseException:
            client.close()
            raise
        jail = DockerJail(client, ws, profile, tree.root if tree else ws, tree, user, scratch)
        try:
            if tree is not None:
                await anyio.to_thread.run_sync(_own_tree, tree, user)
            if scratch is not None:
                await anyio.to_thread.run_sync(_own_dir, scratch, user)
            await jail.start()
        except BaseException:
            with anyio.CancelScope(shield=True):
                await jail.aclose()
            raise
        return jail


# ------------------------------------------------------------------------------ probe


_PROVIDED = (
    "fs-readonly-root",
    "fs-write-confined",
    "fs-hidden-home",
    "net-none",
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
    report.details.update(
        server=info.get("ServerVersion"),
        host=client.api.base_url,
        image=DEFAULT_IMAGE,
        kernel=info.get("KernelVersion"),
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


@cache
def probe() -> Report:
    """Daemon reachable (short timeout), image present, what the daemon enforces (cached)."""
    try:
        client = connect(PROBE_TIMEOUT_S)
    except BackendUnavailable as exc:
        return Report("docker", False, exc.message)
    try:
        with _translated("cannot query the Docker daemon"):
            return _probe_report(client)
    except BackendUnavailable as exc:
        return Report("docker", False, exc.message)
    finally:
        client.close()


# ------------------------------------------------------------------------------ gc


def _owner_gone(labels: Mapping[str, str]) -> bool:
    pid_text, _, host = labels.get(LABEL_OWNER, "").partition("@")
    if host != socket.gethostname() or not pid_text.isdigit():
        return False  # another machine's executor: we cannot tell, leave it
    try:
        started = psutil.Process(int(pid_text)).create_time()
    except psutil.Error:
        return True
    return f"{started:.2f}" != labels.get(LABEL_OWNER_STARTED)


def gc(all: bool = False) -> list[str]:  # noqa: A002 - mirrors `sandbox gc --all`
    """Remove sandbox containers whose executor is gone (every sandbox container with ``all``).

    Returns the names of the containers removed.
    """
    removed: list[str] = []
    with contextlib.closing(connect()) as client:
        with _translated("cannot list sandbox containers"):
            rows = client.api.containers(all=True, filters={"label": LABEL_OWNER})
        for row in rows:
            if all or _owner_gone(row.get("Labels") or {}):
                name = str((row.get("Names") or [row["Id"]])[0]).lstrip("/")
                with _translated(f"cannot remove container {name}"):
                    _remove_by_id(client, str(row["Id"]))
                removed.append(name)
    return removed


backend_class = DockerBackend
