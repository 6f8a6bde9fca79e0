"""The warm Docker jail's two links to its agent: the unix socket that carries pipe ends, and the
attach stream kept as the fallback (see :mod:`sandbox.backends.docker.links`).

Against a real dockerd; skipped when none is reachable or the image is not built. The contract
suite (test_contracts.py) runs its docker parametrisation over the socket, the default here;
these pin the socket down, force the fallback, and attack the socket from inside the jail.
"""

from __future__ import annotations

import os
import socket
import time
from typing import TYPE_CHECKING, Any

import anyio
import pytest

from sandbox import exec as executor
from sandbox.backends import docker as dockerb
from sandbox.backends.child import FdReceiveStream
from sandbox.backends.docker import links, warm
from sandbox.backends.docker.config import with_agent_socket
from sandbox.backends.docker.runtime import Runtime
from sandbox.backends.docker.streams import ChunkStream
from sandbox.errors import BackendUnavailable, find_error
from tests.conftest import survivors
from tests.integration._docker import Jails, docker_or_skip

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

MIB = 1 << 20


@pytest.fixture
def backend() -> dockerb.DockerBackend:
    return docker_or_skip()


@pytest.fixture
async def jails(backend: dockerb.DockerBackend, workspace: Path) -> AsyncIterator[Jails[dockerb.WarmJail]]:
    async with Jails(backend, workspace, (dockerb.WarmJail,)) as opened:
        yield opened


@pytest.fixture(params=["socket", "attach"])
def stream(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both links: the socket (the default on a local engine) and the attach stream, forced."""
    if request.param == "attach":
        monkeypatch.setenv(links.STREAMS_ENV, "attach")
    return str(request.param)


async def sh(jail: dockerb.WarmJail, script: str, **kw: Any) -> executor.ExecResult:
    return await executor.run(jail, ["/bin/sh", "-c", script], **kw)


# --- which link -----------------------------------------------------------------------------


async def test_a_local_engine_gets_the_socket_and_it_is_gone_once_connected(
    jails: Jails[dockerb.WarmJail], data_dir: Path
) -> None:
    jail = await jails.open()
    assert (jail.stream, jail.stream_note) == ("socket", "")
    # The listener, its socket and its directory went as soon as the agent's connection was checked.
    assert list((data_dir / "run").iterdir()) == []
    result = await sh(jail, f"ls -A {links.AGENT_DIR}; test -e {links.AGENT_SOCKET} && echo FOUND; echo done")
    assert result.stdout == "done\n", result
    # A call's output is our own pipe, read like a local child's; nothing comes through the agent.
    proc = await jail.spawn(["echo", "direct"])
    try:
        assert isinstance(proc, warm.PipeProcess) and isinstance(proc.stdout, FdReceiveStream)
        assert await proc.stdout.receive() == b"direct\n"
        assert await proc.wait() == 0
    finally:
        proc.release()


async def test_the_fallback_is_forced_by_the_environment(
    jails: Jails[dockerb.WarmJail], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(links.STREAMS_ENV, "attach")
    jail = await jails.open()
    assert jail.stream == "attach" and links.STREAMS_ENV in jail.stream_note


def test_a_remote_engine_gets_the_attach_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(links.STREAMS_ENV, raising=False)
    assert links.socket_wanted("http+docker://localhost") is None
    assert "remote engine" in (links.socket_wanted("https://build-host:2376") or "")
    assert "remote engine" in (links.socket_wanted("http+docker://ssh") or "")


async def test_an_agent_that_cannot_reach_the_socket_falls_back_to_attach(
    jails: Jails[dockerb.WarmJail], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(warm, "AGENT_SOCKET", f"{links.AGENT_DIR}/elsewhere.sock")
    jail = await jails.open()
    assert jail.stream == "attach" and "cannot connect" in jail.stream_note
    result = await sh(jail, "echo out; echo err >&2")
    assert (result.stdout, result.stderr) == ("out\n", "err\n")


async def test_an_engine_that_cannot_bind_the_socket_falls_back_to_attach(
    jails: Jails[dockerb.WarmJail], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def unbindable(config: dict[str, Any], _folder: Path, path: str) -> dict[str, Any]:
        return with_agent_socket(config, tmp_path / "not-on-the-engine", path)

    monkeypatch.setattr(warm, "with_agent_socket", unbindable)
    jail = await jails.open()
    # dockerd refuses the missing bind source; Podman creates it, empty, and the agent finds no socket there.
    assert jail.stream == "attach" and ("cannot bind" in jail.stream_note or "cannot connect" in jail.stream_note)
    assert (await sh(jail, "echo fine")).stdout == "fine\n"


async def test_a_connection_from_another_pid_is_refused_and_the_jail_uses_attach(
    jails: Jails[dockerb.WarmJail], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The peer check: a connection whose pid is not the container's PID 1 as we see it is dropped."""
    monkeypatch.setattr(Runtime, "pid", lambda _self: 1)  # nobody's agent is our pid 1
    jail = await jails.open()
    assert jail.stream == "attach" and "not the container's agent" in jail.stream_note
    assert (await sh(jail, "echo fine")).stdout == "fine\n"


def test_the_listener_takes_one_connection_and_checks_its_pid() -> None:
    listener = links.Listener()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as impostor:
        impostor.connect(str(listener.path))
        with pytest.raises(links.PeerRefused, match=f"pid {os.getpid()}"):
            listener.accept(os.getpid() + 1)
    assert not listener.folder.exists()  # gone with the first connection, good or bad
    listener = links.Listener()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as agent:
        agent.connect(str(listener.path))
        conn = listener.accept(os.getpid())
        conn.close()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as late, pytest.raises(FileNotFoundError):
        late.connect(str(listener.path))


# --- streams over either link ---------------------------------------------------------------


async def test_stdout_and_stderr_stay_apart_with_stdin_and_exit_code(
    jails: Jails[dockerb.WarmJail], stream: str
) -> None:
    jail = await jails.open()
    assert jail.stream == stream
    script = "for i in 1 2 3; do echo out$i; echo err$i >&2; done; cat; exit 3"
    result = await sh(jail, script, stdin=b"from stdin\n")
    assert result.stdout == "out1\nout2\nout3\nfrom stdin\n"
    assert result.stderr == "err1\nerr2\nerr3\n"
    assert result.exit_code == 3
    missing = await executor.run(jail, ["no-such-command-here"])
    assert missing.exit_code == 127 and "no-such-command-here" in missing.stderr
    ignored = await executor.run(jail, ["true"], stdin=b"x" * (4 * MIB))  # never read: no hang
    assert ignored.exit_code == 0


async def test_a_streamed_stdin_of_many_mib_arrives_whole(jails: Jails[dockerb.WarmJail], stream: str) -> None:
    jail = await jails.open()
    chunk = bytes(range(256)) * 4096  # 1 MiB

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(8):
            yield chunk

    send, receive = anyio.create_memory_object_stream[bytes](1)

    async def produce() -> None:
        async with send:
            async for piece in chunks():
                await send.send(piece)

    async with receive, anyio.create_task_group() as tg:
        tg.start_soon(produce)
        result = await sh(jail, "wc -c; echo done >&2", stdin=ChunkStream(receive))
    assert jail.stream == stream
    assert result.stdout.strip() == str(8 * MIB) and result.stderr == "done\n"


async def test_64_mib_of_stdout_is_exact_and_quick_over_the_socket(jails: Jails[dockerb.WarmJail]) -> None:
    """No byte crosses dockerd: the attach stream moves about 20 MiB/s, the pipes hundreds."""
    jail = await jails.open(**{"limits.capture_bytes": 65536})
    await sh(jail, "true")  # warm: the agent is up
    started = time.monotonic()
    result = await sh(jail, "head -c 67108864 /dev/zero; echo tail >&2")
    elapsed = time.monotonic() - started
    assert jail.stream == "socket"
    assert result.stdout_bytes == 64 * MIB and result.stdout_truncated
    assert result.stderr == "tail\n" and result.exit_code == 0
    assert elapsed < 2.0, f"64 MiB took {elapsed:.2f} s"


async def test_timeout_and_abort_kill_the_whole_tree(jails: Jails[dockerb.WarmJail], marker: str, stream: str) -> None:
    jail = await jails.open(**{"timeouts.kill_grace_s": 0.3})
    survivors_script = (
        f"trap '' TERM; setsid sh -c 'trap \"\" TERM; exec sleep {marker}' & "
        f"( (sleep {marker} &) & ); nohup sleep {marker} >/dev/null 2>&1 & "
        f"head -c 10000000 /dev/zero; echo started >&2; sleep {marker}"
    )
    timed = await sh(jail, survivors_script, timeout=2)
    assert timed.timed_out and timed.stdout_bytes == 10_000_000 and "started" in timed.stderr
    assert survivors(marker) == []

    abort = anyio.Event()

    async def abort_once_started() -> None:
        with anyio.fail_after(20):
            while len(survivors(marker)) < 3:
                await anyio.sleep(0.05)
        abort.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(abort_once_started)
        aborted = await sh(jail, survivors_script, abort=abort, timeout=60)
    assert aborted.aborted and survivors(marker) == []
    after = await sh(jail, "echo next")
    assert after.stdout == "next\n" and jail.stream == stream


async def test_cancelling_the_caller_kills_the_tree_and_the_jail_goes_on(
    jails: Jails[dockerb.WarmJail], marker: str
) -> None:
    jail = await jails.open(**{"timeouts.kill_grace_s": 0.2})
    with anyio.move_on_after(1.5):
        await sh(jail, f"setsid sh -c 'sleep {marker}' & yes; sleep {marker}")
    assert survivors(marker) == []
    assert (await sh(jail, "echo next")).stdout == "next\n"


# --- attacks on the socket from inside the jail ---------------------------------------------

ATTACK = """
import os, socket
for path in ("{sock}", "/proc/1/fd/3", "/proc/1/fd/4"):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
        print("CONNECTED", path)
    except OSError as exc:
        print("refused", path, exc.strerror)
try:
    own = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    own.bind("{sock}")
    print("PLANTED")
except OSError as exc:
    print("refused bind", exc.strerror)
try:
    os.listdir("/proc/1/fd")
    print("LISTED")
except OSError as exc:
    print("refused list", exc.strerror)
# The kernel lists the socket of our accepted connection in the container's namespace, under the
# host path it was bound to: a name only, which leads nowhere in the container.
with open("/proc/net/unix") as fh:
    paths = [row.split()[7] for row in fh if len(row.split()) == 8 and row.split()[7].startswith("/")]
print("paths", len(paths))
for path in paths:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
        print("CONNECTED", path)
    except OSError as exc:
        print("unreachable", path, exc.strerror)
"""


async def test_a_jailed_command_cannot_reach_or_replace_the_agents_socket(jails: Jails[dockerb.WarmJail]) -> None:
    jail = await jails.open()
    cid = jail.container_id
    assert jail.stream == "socket"
    result = await executor.run(jail, ["python3", "-c", ATTACK.format(sock=links.AGENT_SOCKET)])
    assert result.exit_code == 0, result.stderr
    assert "CONNECTED" not in result.stdout and "PLANTED" not in result.stdout, result.stdout
    assert "LISTED" not in result.stdout
    assert result.stdout.count("refused") == 5
    assert result.stdout.count("unreachable") == int(result.stdout.split("paths ")[1].split()[0])
    # The jail still drives the same agent over the connection it checked at start.
    again = await sh(jail, "echo still")
    assert again.stdout == "still\n" and jail.container_id == cid and jail.stream == "socket"


async def test_the_agent_dying_ends_the_socket_call_with_a_structured_error(jails: Jails[dockerb.WarmJail]) -> None:
    """docker kill mid-call: the socket and the attach stream end; the call is BACKEND_UNAVAILABLE."""
    jail = await jails.open()
    cid = jail.container_id
    assert cid is not None and jail.stream == "socket"

    async def kill_soon() -> None:
        await anyio.sleep(1)
        await anyio.to_thread.run_sync(lambda: jail.client.containers.get(cid).kill())

    async def call() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(kill_soon)
            await sh(jail, "yes", timeout=30)

    with pytest.raises(BaseException) as info:  # noqa: PT011 - the error may come wrapped in groups
        await call()
    error = find_error(info.value, BackendUnavailable)
    assert error is not None and "killed from outside" in error.message
    again = await sh(jail, "echo recovered")
    assert again.stdout == "recovered\n" and jail.container_id != cid and jail.stream == "socket"


def test_sandbox_check_says_which_link_warm_jails_use(
    backend: dockerb.DockerBackend,  # noqa: ARG001 - skips without a daemon
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(links.STREAMS_ENV, raising=False)
    assert dockerb.DockerBackend().probe().details["stream"] == "socket"
    monkeypatch.setenv(links.STREAMS_ENV, "attach")
    assert dockerb.DockerBackend().probe().details["stream"] == f"attach ({links.STREAMS_ENV}=attach)"
