"""Per-call Docker jails (``lifecycle = "call"``): a fresh container per call, through the agent, from a pool.

Against a real dockerd. What is claimed and attacked here: each call runs in a container no other
call had (its own pid namespace, ``/tmp`` and home), with the agent as PID 1 and no
``docker exec``; the call's container is gone after the call and the pool refills; the
executor's seccomp filter is stacked on Docker's default (two filters, the probes of
test_seccomp.py refused with EPERM); a container that died while waiting in the pool is not
handed out; closing the jail, or killing the executor, leaves no container.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from types import SimpleNamespace
from typing import TYPE_CHECKING, cast

import anyio
import docker
import pytest

from sandbox import exec as executor
from sandbox.backends import docker as dockerb
from sandbox.backends.docker.links import stale_listener_dirs
from sandbox.backends.docker.percall import PerCallJail
from sandbox.backends.docker.pool import POOL_SIZE, Box, Pool
from sandbox.errors import BackendUnavailable
from tests.conftest import backend_or_skip, make_profile, own_like_a_checkout, survivors
from tests.integration.test_seccomp import PROBE, _not_refused, _numbers

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator
    from pathlib import Path

    from sandbox.backends.agentlink import Link
    from sandbox.backends.docker.runtime import Runtime

pytestmark = [pytest.mark.anyio]
DOCKER = pytest.mark.docker  # the pool's own logic (the fakes at the end) needs no daemon

# The container a command runs in, as the command sees it: Docker binds /etc/hostname from
# /var/lib/docker/containers/<id>/, and mountinfo names that source.
WHERE = "grep -o 'containers/[0-9a-f]\\{64\\}' /proc/self/mountinfo | head -1 | cut -d/ -f2"


@pytest.fixture
def client() -> Iterator[docker.DockerClient]:
    backend_or_skip("docker")
    with contextlib.closing(dockerb.connect()) as c:
        yield c


@pytest.fixture
async def jail(client: docker.DockerClient, workspace: Path) -> AsyncIterator[PerCallJail]:  # noqa: ARG001 - skips
    own_like_a_checkout(workspace)
    opened = await dockerb.DockerBackend().open_jail(workspace, make_profile(**{"docker.lifecycle": "call"}))
    assert isinstance(opened, PerCallJail)
    try:
        yield opened
    finally:
        await opened.aclose()


def containers(client: docker.DockerClient, jail_id: str) -> list[str]:
    found = client.api.containers(all=True, filters={"label": f"{dockerb.LABEL_JAIL}={jail_id}"})
    return [str(row["Id"]) for row in found]


async def eventually(check: object, timeout: float = 15) -> None:
    with anyio.fail_after(timeout):
        while not check():  # type: ignore[operator]
            await anyio.sleep(0.05)


@DOCKER
async def test_each_call_has_a_container_of_its_own_with_the_agent_as_pid_1(
    jail: PerCallJail, client: docker.DockerClient
) -> None:
    pid1 = "head -c 25 /proc/1/cmdline | tr '\\0' ' '; echo"
    script = f"{WHERE}; cat /tmp/kept 2>/dev/null || echo fresh; echo x > /tmp/kept; {pid1}"
    seen = []
    for _ in range(4):
        result = await executor.run(jail, ["sh", "-c", script])
        assert result.exit_code == 0, result
        cid, fresh, pid1 = result.stdout.splitlines()
        assert fresh == "fresh" and pid1.startswith("/usr/bin/python3 -I -S -c"), result.stdout
        seen.append(cid)
    async with anyio.create_task_group() as tg:  # concurrent calls: never one container for two
        for _ in range(3):

            async def one() -> None:
                seen.append((await executor.run(jail, ["sh", "-c", WHERE])).stdout.strip())

            tg.start_soon(one)
    assert len(set(seen)) == len(seen) == 7, seen
    assert jail.stream == "socket", jail.stream_note
    # Nothing went through dockerd: no call was a `docker exec`.
    for cid in containers(client, jail.id):
        with contextlib.suppress(docker.errors.NotFound):
            assert not client.api.inspect_container(cid).get("ExecIDs")
    # The used containers go; the pool refills to its size, with containers no call has seen.
    await eventually(lambda: not set(seen) & set(containers(client, jail.id)))
    await jail.pool.full()
    assert jail.pool.ready == POOL_SIZE and len(containers(client, jail.id)) == POOL_SIZE


@DOCKER
async def test_per_call_containers_stack_our_seccomp_filter_on_dockers_default(jail: PerCallJail) -> None:
    status = await executor.run(jail, ["grep", "^Seccomp", "/proc/self/status"])
    result = await executor.run(jail, ["python3", "-c", PROBE, _numbers()])
    assert "Seccomp:\t2" in status.stdout and "Seccomp_filters:\t2" in status.stdout, status.stdout
    assert result.exit_code == 0, result.stderr
    wrong = _not_refused(json.loads(result.stdout))
    assert wrong == {}, f"calls the filter should refuse were answered otherwise in a per-call container: {wrong}"


@DOCKER
async def test_a_background_process_dies_with_its_call(jail: PerCallJail, marker: str) -> None:
    result = await executor.run(jail, ["sh", "-c", f"setsid sh -c 'trap \"\" TERM; sleep {marker}' & echo started"])
    assert result.stdout == "started\n"
    assert survivors(marker) == []  # swept before the call returned, not merely later
    timed_out = await executor.run(jail, ["sh", "-c", f"sleep {marker} & sleep {marker}"], timeout=1)
    assert timed_out.timed_out and survivors(marker) == []


@DOCKER
async def test_a_container_killed_in_the_pool_is_not_handed_out(jail: PerCallJail, client: docker.DockerClient) -> None:
    await jail.pool.full()
    waiting = containers(client, jail.id)
    assert len(waiting) == POOL_SIZE
    for cid in waiting:
        client.api.kill(cid)
    result = await executor.run(jail, ["sh", "-c", f"{WHERE}; echo ran"])
    assert result.exit_code == 0 and result.stdout.splitlines()[-1] == "ran", result
    assert result.stdout.splitlines()[0] not in waiting


@DOCKER
async def test_closing_the_jail_removes_every_container(client: docker.DockerClient, workspace: Path) -> None:
    own_like_a_checkout(workspace)
    jail = await dockerb.DockerBackend().open_jail(workspace, make_profile(**{"docker.lifecycle": "call"}))
    assert isinstance(jail, PerCallJail)
    try:
        assert containers(client, jail.id) != []  # the pool started ahead
        await executor.run(jail, ["true"])  # a refill is under way as we close
    finally:
        await jail.aclose()
    assert containers(client, jail.id) == []


KILLED = textwrap.dedent(
    """
    import anyio, sys
    from pathlib import Path
    from sandbox import exec as executor
    from sandbox.backends import docker as dockerb
    from sandbox.profile import load

    async def main():
        prof = load("default").with_overrides(**{"docker.lifecycle": "call"})
        jail = await dockerb.DockerBackend().open_jail(Path(sys.argv[1]), prof)
        await executor.run(jail, ["true"])
        await jail.pool.full()
        print(jail.id, flush=True)
        await anyio.sleep(600)

    anyio.run(main)
    """
)


@DOCKER
@pytest.mark.slow
async def test_a_killed_executor_leaves_no_container(client: docker.DockerClient, workspace: Path) -> None:
    """SIGKILL, no clean-up of ours: the idle agents see their links end and their containers go."""
    own_like_a_checkout(workspace)
    child = subprocess.Popen(  # noqa: ASYNC220 - a child we SIGKILL: anyio's process would reap it for us
        [sys.executable, "-c", KILLED, str(workspace)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        with anyio.fail_after(60):
            jail_id = (await anyio.to_thread.run_sync(child.stdout.readline)).strip()
        assert jail_id, child.stderr.read() if child.stderr else ""
        assert len(containers(client, jail_id)) == POOL_SIZE
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
        for stream in (child.stdout, child.stderr):
            if stream is not None:
                stream.close()
    await eventually(lambda: containers(client, jail_id) == [], timeout=30)


# --- the pool's logic, with fake containers (no daemon) ------------------------------------


class FakeEngine:
    """Starts fake boxes (``delay`` each, failing while ``broken``) and records what was dropped."""

    def __init__(self, delay: float = 0.01) -> None:
        self.delay = delay
        self.broken = False
        self.made: list[Box] = []
        self.dropped: list[Box] = []

    async def launch(self) -> Box:
        await anyio.sleep(self.delay)
        if self.broken:
            raise BackendUnavailable("the daemon is gone", backend="docker")
        runtime = SimpleNamespace(removed=False)
        link = SimpleNamespace(dead=False, retired=False)
        box = Box(cast("Runtime", runtime), cast("Link", link))
        self.made.append(box)
        return box

    async def drop(self, box: Box) -> None:
        self.dropped.append(box)


async def test_the_pool_never_hands_a_container_out_twice_and_refills() -> None:
    engine = FakeEngine()
    pool = Pool(engine.launch, engine.drop, size=2)
    await pool.start()
    taken = [await pool.take() for _ in range(6)]
    async with anyio.create_task_group() as tg:
        for _ in range(4):

            async def take() -> None:
                taken.append(await pool.take())

            tg.start_soon(take)
    assert len({id(box) for box in taken}) == len(taken) == 10
    await pool.full()
    assert pool.ready == 2 and not pool.filling
    await pool.close()
    assert len(engine.dropped) == 2 and pool.ready == 0


async def test_a_dead_waiting_container_is_dropped_not_handed_out() -> None:
    engine = FakeEngine()
    pool = Pool(engine.launch, engine.drop, size=2)
    await pool.start()
    await pool.full()
    first = engine.made[0]
    first.link.dead = True
    got = await pool.take()
    assert got is not first and first in engine.dropped
    await pool.close()


async def test_a_failing_start_reaches_the_next_call_and_the_pool_recovers() -> None:
    engine = FakeEngine()
    pool = Pool(engine.launch, engine.drop, size=2)
    await pool.start()
    engine.broken = True
    await pool.take()  # the one ready; the refill behind it fails
    await pool.full()
    assert isinstance(pool.error, BackendUnavailable) and pool.ready == 0
    with pytest.raises(BackendUnavailable, match="daemon is gone"):
        await pool.take()  # fail closed: the call meets the error itself
    engine.broken = False
    await pool.take()
    await pool.full()
    assert pool.error is None and pool.ready == 2
    await pool.close()


async def test_closing_cancels_the_start_in_flight_and_leaves_nothing() -> None:
    engine = FakeEngine()
    pool = Pool(engine.launch, engine.drop, size=2)
    await pool.start()
    await pool.full()
    engine.delay = 30
    await pool.take()
    await pool.take()  # the two ready ones: now the filler is inside a 30 s start
    await anyio.sleep(0.1)
    assert pool.filling
    with anyio.fail_after(5):
        await pool.close()
    assert not pool.filling and pool.ready == 0 and len(engine.made) == 2
    await anyio.sleep(0.2)  # no start resumes after the close
    assert len(engine.made) == 2


def test_stale_listener_directories_are_swept_and_live_ones_kept(data_dir: Path) -> None:
    """What a killed executor can leave besides labelled containers: a listener's socket directory."""
    run = data_dir / "run"
    old, young = run / "agent-old", run / "agent-young"
    for folder in (old, young):
        folder.mkdir(parents=True)
        (folder / "agent.sock").touch()
    os.utime(old, (0, 0))
    assert stale_listener_dirs() == [old]
    assert not old.exists() and young.exists()
