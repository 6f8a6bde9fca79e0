"""Docker-specific behaviour against a real dockerd: lifecycles, labels, gc, faults.

The shared contracts (streams, tree kill, limits, mounts) are in test_contracts.py; these are
what only the Docker backend has. Skipped only when no daemon is reachable or the image is not
built, with that reason.
"""

from __future__ import annotations

import contextlib
import gc
import os
import shutil
import signal
import socket
import subprocess
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import docker
import docker.errors
import psutil
import pytest

import sandbox
from sandbox import exec as executor
from sandbox.backends import docker as dockerb
from sandbox.backends.docker.links import AGENT_DIR
from sandbox.backends.docker.pool import POOL_SIZE
from sandbox.errors import BackendUnavailable, find_error
from tests.conftest import make_profile, survivors
from tests.integration._docker import Jails, docker_or_skip

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Iterator

pytestmark = [pytest.mark.docker, pytest.mark.anyio]


@pytest.fixture
def backend() -> dockerb.DockerBackend:
    return docker_or_skip()


@pytest.fixture
def client(backend: dockerb.DockerBackend) -> Iterator[docker.DockerClient]:  # noqa: ARG001 - skips without a daemon
    with contextlib.closing(dockerb.connect()) as c:
        yield c


@pytest.fixture
async def jails(backend: dockerb.DockerBackend, workspace: Path) -> AsyncIterator[Jails[dockerb.DockerJail]]:
    async with Jails(backend, workspace, (dockerb.DockerJail,)) as opened:
        yield opened


async def unavailable(call: Awaitable[None]) -> BackendUnavailable:
    """The BackendUnavailable a call raised, alone or inside task groups' exception groups."""
    try:
        await call
    except BaseException as exc:
        found = find_error(exc, BackendUnavailable)
        if found is None:
            raise
        return found
    raise AssertionError("the call did not raise BackendUnavailable")


def jail_containers(client: docker.DockerClient, jail: dockerb.DockerJail) -> list[str]:
    found = client.api.containers(all=True, filters={"label": f"{dockerb.LABEL_JAIL}={jail.id}"})
    return [str(row["Id"]) for row in found]


async def test_session_lifecycle_reuses_one_labelled_container(
    jails: Jails[dockerb.DockerJail], client: docker.DockerClient
) -> None:
    jail = await jails.open()
    first = await executor.run(jail, ["sh", "-c", "echo x > /tmp/kept; hostname"])
    second = await executor.run(jail, ["cat", "/tmp/kept"])
    assert (first.stdout, second.stdout) == ("sandbox\n", "x\n")
    (cid,) = jail_containers(client, jail)
    labels = client.containers.get(cid).labels
    assert labels[dockerb.LABEL_OWNER] == f"{os.getpid()}@{os.uname().nodename}"
    assert labels[dockerb.LABEL_LIFECYCLE] == "session"
    await jail.aclose()
    assert jail_containers(client, jail) == []


async def test_call_lifecycle_uses_a_fresh_container_per_call(
    jails: Jails[dockerb.DockerJail], client: docker.DockerClient
) -> None:
    jail = await jails.open(**{"docker.lifecycle": "call"})
    assert isinstance(jail, dockerb.PerCallJail)
    ahead = set(jail_containers(client, jail))  # the pool's, started before any call
    assert 0 < len(ahead) <= POOL_SIZE
    first = await executor.run(jail, ["sh", "-c", "echo x > /tmp/kept; head -c 16 /proc/1/cmdline"])
    second = await executor.run(jail, ["sh", "-c", "cat /tmp/kept || echo fresh"])
    # The agent is PID 1, as in a warm jail; the second call's container never saw the first.
    assert first.stdout == "/usr/bin/python3" and "fresh" in second.stdout  # by its absolute path
    with anyio.fail_after(10):  # the calls' containers go once the calls are over
        while ahead & set(jail_containers(client, jail)):
            await anyio.sleep(0.05)


async def test_container_confinement_settings(
    jails: Jails[dockerb.DockerJail], workspace: Path, client: docker.DockerClient
) -> None:
    jail = await jails.open(**{"limits.cpus": 0.5})
    (cid,) = jail_containers(client, jail)
    host = client.containers.get(cid).attrs["HostConfig"]
    assert host["ReadonlyRootfs"] and host["CapDrop"] == ["ALL"]
    assert host["SecurityOpt"] == ["no-new-privileges"] and host["NetworkMode"] == "none"
    assert host["Memory"] == host["MemorySwap"] == jail.profile.limits.memory
    assert host["PidsLimit"] == jail.profile.limits.pids and host["NanoCpus"] == 500_000_000
    # CPU seconds count per process: the long-lived agent sets that limit on each command instead.
    assert {u["Name"] for u in host["Ulimits"]} == {"nofile", "fsize"}
    mounts = client.containers.get(cid).attrs["Mounts"]
    binds = [m["Source"] for m in mounts if m["Destination"] != AGENT_DIR]
    assert binds == [str(workspace)] and all("docker.sock" not in m["Source"] for m in mounts)
    # Beside the workspace only the agent's socket directory, read-only (see links.py).
    assert [m["RW"] for m in mounts if m["Destination"] == AGENT_DIR] == [False]
    seccomp = await executor.run(jail, ["grep", "^Seccomp:", "/proc/self/status"])
    assert seccomp.stdout.split() == ["Seccomp:", "2"]
    limits = await executor.run(jail, ["sh", "-c", "ulimit -t; ulimit -n"])
    assert limits.stdout.split() == [str(jail.profile.limits.cpu_time_s), str(jail.profile.limits.nofile)]


async def test_timeout_leaves_no_process_in_the_container(jails: Jails[dockerb.DockerJail]) -> None:
    jail = await jails.open()
    script = "trap '' TERM; setsid sh -c 'trap \"\" TERM; sleep 600' & sleep 600"
    proc = await jail.spawn(["sh", "-c", script])
    with anyio.fail_after(10):
        while len(await anyio.to_thread.run_sync(proc.running_pids)) < 3:
            await anyio.sleep(0.05)
    await proc.kill_tree(0.2)
    assert await anyio.to_thread.run_sync(proc.running_pids) == []
    proc.release()


async def test_the_command_cannot_kill_or_stop_the_agent(jails: Jails[dockerb.DockerJail]) -> None:
    """The agent is PID 1 of the container: the kernel drops signals it has no handler for."""
    jail = await jails.open()
    cid = jail.container_id
    for sig in ("KILL", "STOP", "TERM", "INT", "HUP", "QUIT"):
        result = await executor.run(jail, ["sh", "-c", f"kill -{sig} 1; kill -{sig} -1; echo survived"])
        assert result.stdout == "survived\n", sig
    after = await executor.run(jail, ["echo", "same"])
    assert after.stdout == "same\n" and jail.container_id == cid


PEEK_AT_THE_AGENT = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
print("ptrace", libc.ptrace(16, 1, 0, 0), os.strerror(ctypes.get_errno()))  # PTRACE_ATTACH
for path in ("/proc/1/mem", "/proc/1/fd/0", "/proc/1/fd/1", "/proc/1/environ"):
    try:
        os.close(os.open(path, os.O_WRONLY if "/fd/" in path else os.O_RDONLY))
        print("OPENED", path)
    except OSError as exc:
        print("refused", path, exc.strerror)
"""


async def test_the_agent_cannot_be_ptraced_or_its_pipes_opened(jails: Jails[dockerb.DockerJail]) -> None:
    jail = await jails.open()
    result = await executor.run(jail, ["python3", "-c", PEEK_AT_THE_AGENT])
    assert result.exit_code == 0, result.stderr
    assert "ptrace -1 Operation not permitted" in result.stdout
    assert "OPENED" not in result.stdout and result.stdout.count("refused") == 4


async def test_a_call_that_changes_the_agents_limits_spoils_only_its_container(
    jails: Jails[dockerb.DockerJail],
) -> None:
    """prlimit and setpriority need only the same uid: the agent retires rather than pass them on."""
    jail = await jails.open()
    cid = jail.container_id
    script = "import os, resource; resource.prlimit(1, resource.RLIMIT_NOFILE, (64, 64)); os.setpriority(0, 1, 19)"
    tamper = await executor.run(jail, ["python3", "-c", script])
    assert tamper.exit_code == 0, tamper.stderr
    after = await executor.run(jail, ["sh", "-c", "ulimit -n; nice"])
    assert after.stdout.split() == [str(jail.profile.limits.nofile), "0"]
    assert jail.container_id not in (None, cid)


async def test_a_leftover_background_process_dies_before_the_next_call(
    jails: Jails[dockerb.DockerJail], marker: str
) -> None:
    jail = await jails.open()
    script = (
        f"setsid sh -c 'trap \"\" TERM; exec sleep {marker}' & ( (sleep {marker} &) & ); "
        f"nohup sleep {marker} >/dev/null 2>&1 & echo started"
    )
    first = await executor.run(jail, ["sh", "-c", script])
    assert first.stdout == "started\n"
    assert survivors(marker) == []
    second = await executor.run(jail, ["ps", "-e", "-o", "pid=,comm="])
    rows = [line.split() for line in second.stdout.splitlines()]
    assert sorted(comm for _, comm in rows) == ["ps", "python3"], second.stdout
    assert ["1", "python3"] in rows


@pytest.mark.root
async def test_the_agent_dying_mid_call_is_a_structured_error_and_nothing_runs_on_the_host(
    jails: Jails[dockerb.DockerJail], client: docker.DockerClient, marker: str
) -> None:
    if os.geteuid() != 0:
        pytest.skip("killing the container's PID 1 from the host needs root")
    jail = await jails.open()
    cid = jail.container_id
    assert cid is not None
    host_pid = int(client.containers.get(cid).attrs["State"]["Pid"])
    probe = Path("/tmp") / f"sandbox-agent-probe-{marker}"

    async def kill_agent() -> None:
        while not survivors(marker):
            await anyio.sleep(0.05)
        os.kill(host_pid, signal.SIGKILL)

    async def call() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(kill_agent)
            await executor.run(jail, ["sh", "-c", f"sleep {marker}; touch {probe}"], timeout=30)

    with anyio.fail_after(20):
        error = await unavailable(call())
    assert "agent died" in error.message and error.data["container"] == cid
    assert survivors(marker) == [] and not probe.exists()
    again = await executor.run(jail, ["sh", "-c", f"touch {probe}; echo fresh"])
    assert again.stdout == "fresh\n" and jail.container_id not in (None, cid)
    assert not probe.exists()


async def test_gc_removes_containers_of_a_dead_executor(client: docker.DockerClient) -> None:
    async with await anyio.open_process(["true"]) as dead:
        await dead.wait()
    labels = {
        dockerb.LABEL_OWNER: f"{dead.pid}@{os.uname().nodename}",
        dockerb.LABEL_OWNER_STARTED: "1.00",
        dockerb.LABEL_JAIL: "gc-test",
    }
    container = client.containers.create(dockerb.DEFAULT_IMAGE, ["true"], labels=labels)
    mine = client.containers.create(
        dockerb.DEFAULT_IMAGE, ["true"], labels=dockerb.owner_labels("gc-test-live", "session")
    )
    try:
        removed = await anyio.to_thread.run_sync(dockerb.gc)
        assert container.name in removed and mine.name not in removed
        with pytest.raises(docker.errors.NotFound):
            client.containers.get(str(container.id))
    finally:
        for c in (container, mine):
            with contextlib.suppress(docker.errors.NotFound):
                c.remove(force=True)


async def test_missing_image_says_make_image(backend: dockerb.DockerBackend, workspace: Path) -> None:
    with pytest.raises(BackendUnavailable, match="make image") as info:
        await backend.open_jail(workspace, make_profile(**{"docker.image": "sandbox-runtime:0.0.0-missing"}))
    assert info.value.data["image"] == "sandbox-runtime:0.0.0-missing"


async def test_wrong_image_version_is_refused(client: docker.DockerClient) -> None:
    ref = "sandbox-runtime:0.0.0-test"
    container = client.containers.create(dockerb.DEFAULT_IMAGE, ["true"])
    try:
        container.commit("sandbox-runtime", "0.0.0-test", changes=['LABEL sandbox.image.version="0.0.0"'])
        with pytest.raises(BackendUnavailable, match="built for sandbox 0.0.0") as info:
            dockerb.check_image(client, ref)
        assert info.value.data["expected"] == sandbox.__version__
    finally:
        container.remove(force=True)
        with contextlib.suppress(docker.errors.ImageNotFound):
            client.images.remove(ref)


async def test_unreachable_daemon_fails_fast(
    backend: dockerb.DockerBackend, workspace: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-such.sock")
    started = time.monotonic()
    with pytest.raises(BackendUnavailable, match="unreachable"):
        await backend.open_jail(workspace, make_profile())
    assert time.monotonic() - started < 5


async def test_container_killed_from_outside_is_a_structured_error(
    jails: Jails[dockerb.DockerJail], client: docker.DockerClient
) -> None:
    jail = await jails.open()
    cid = jail.container_id
    assert cid is not None

    async def kill_soon() -> None:
        await anyio.sleep(1)
        await anyio.to_thread.run_sync(lambda: client.containers.get(cid).kill())

    async def call() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(kill_soon)
            await executor.run(jail, ["sleep", "60"], timeout=30)

    error = await unavailable(call())
    assert "killed from outside" in error.message
    assert error.data["exit_code"] == 137 and error.data["oom_killed"] is False
    again = await executor.run(jail, ["echo", "recovered"])
    assert again.stdout == "recovered\n"


# --- a second, disposable daemon that this test may kill ------------------------------------


def _answers(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        try:
            sock.connect(str(path))
        except OSError:
            return False
    return True


class SecondDaemon:
    """A dockerd on its own socket, data root and containerd namespace, holding our image."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.host = f"unix://{root / 'docker.sock'}"
        self.proc: subprocess.Popen[bytes] | None = None

    def argv(self) -> list[str]:
        r = self.root
        return [
            "dockerd",
            "--data-root",
            str(r / "data"),
            "--exec-root",
            str(r / "exec"),
            "--pidfile",
            str(r / "pid"),
            "-H",
            self.host,
            "--bridge",
            "none",
            "--iptables=false",
            "--ip-masq=false",
            "--containerd-namespace",
            "sbxtest",
            "--containerd-plugins-namespace",
            "sbxtest-plugins",
        ]

    def start(self) -> None:
        # A containerd killed with its dockerd may linger as a zombie whose pid the new dockerd
        # would take for a live containerd and wait on forever; let it start a fresh one.
        (self.root / "exec" / "containerd" / "containerd.pid").unlink(missing_ok=True)
        with (self.root / "dockerd.log").open("ab") as log:
            self.proc = subprocess.Popen(self.argv(), stdout=log, stderr=log)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            # Ask the SDK only once the socket answers: it leaks the socket of a failed connect.
            if _answers(self.root / "docker.sock"):
                with contextlib.suppress(docker.errors.DockerException), contextlib.closing(self.client(2)) as c:
                    c.ping()
                    return
            time.sleep(0.2)
        pytest.skip(f"a second dockerd did not start: see {self.root / 'dockerd.log'}")

    def client(self, timeout: int = 30) -> docker.DockerClient:
        return docker.DockerClient(base_url=self.host, timeout=timeout)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def kill_leftovers(self) -> None:
        """Shims (and their containers) of this daemon that outlived it: we started them."""
        for proc in psutil.process_iter(["cmdline"]):
            if any(str(self.root) in part for part in proc.info["cmdline"] or []):
                with contextlib.suppress(psutil.Error):
                    for child in proc.children(recursive=True):
                        child.kill()
                    proc.kill()

    def remove(self) -> None:
        """Unmount what the daemon left under its roots, then delete them."""
        with open("/proc/mounts", encoding="utf-8") as fh:
            mounts = [line.split()[1] for line in fh if f" {self.root}/" in line]
        for mount in sorted(mounts, reverse=True):
            subprocess.run(["umount", "-l", mount], capture_output=True, check=False)
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture
def second_daemon(client: docker.DockerClient) -> Iterator[SecondDaemon]:
    if os.geteuid() != 0 or shutil.which("dockerd") is None:
        pytest.skip("starting a second dockerd needs root and dockerd")
    root = Path("/tmp") / f"sbx-dockerd-{os.getpid()}"
    root.mkdir(parents=True, exist_ok=True)
    daemon = SecondDaemon(root)
    try:
        daemon.start()
        with contextlib.closing(daemon.client(300)) as second:
            second.images.load(b"".join(client.images.get(dockerb.DEFAULT_IMAGE).save(named=True)))
        yield daemon
    finally:
        daemon.stop()
        daemon.kill_leftovers()
        daemon.remove()
        # docker-py leaves unclosed the sockets of requests the dying daemon refused; finalise
        # them here, where that is expected, not as a warning in some later test.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            gc.collect()


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.timeout(300)
# docker-py does not close the socket of a request that fails mid-way when the daemon dies.
@pytest.mark.filterwarnings("ignore::ResourceWarning", "ignore::pytest.PytestUnraisableExceptionWarning")
async def test_daemon_dying_mid_call_is_backend_unavailable_and_leaves_nothing(
    backend: dockerb.DockerBackend, second_daemon: SecondDaemon, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DOCKER_HOST", second_daemon.host)
    jail = await backend.open_jail(workspace, make_profile())

    async def kill_daemon() -> None:
        await anyio.sleep(1.5)
        await anyio.to_thread.run_sync(second_daemon.stop, signal.SIGKILL)

    async def call() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(kill_daemon)
            await executor.run(jail, ["sleep", "120"], timeout=100)

    started = time.monotonic()
    try:
        await unavailable(call())
        assert time.monotonic() - started < 1.5 + 15
    finally:
        with anyio.fail_after(60):
            await jail.aclose()
    await anyio.to_thread.run_sync(second_daemon.start)
    await anyio.to_thread.run_sync(assert_nothing_left, second_daemon)


def assert_nothing_left(daemon: SecondDaemon) -> None:
    """After a restart the daemon removes the auto-remove containers it was running."""
    with contextlib.closing(daemon.client()) as second:
        deadline = time.monotonic() + 30
        left = second.api.containers(all=True, filters={"label": dockerb.LABEL_OWNER})
        while left and time.monotonic() < deadline:
            time.sleep(0.5)
            left = second.api.containers(all=True, filters={"label": dockerb.LABEL_OWNER})
        assert [row["Names"] for row in left] == []
