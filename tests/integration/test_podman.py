"""The docker backend against Podman's Docker-compatible API (issue 17): what differs from dockerd.

The contract suite itself runs against Podman through ``tests/run-podman.sh --test`` (root) and
``--test-user`` (rootless, as the CI user); this module checks what only Podman puts at risk:
the limits a rootless engine accepts and drops, the uid a rootless engine gives the workspace
owner, the rlimits Podman adds on its own, the agent's socket through Podman's bind mounts, and
labels, gc and auto-remove through its API.

It finds Podman without being told: ``SANDBOX_PODMAN_HOST``, else ``DOCKER_HOST`` when that names
a Podman engine, else root's ``/run/podman/podman.sock`` (as root) or the user's
``$XDG_RUNTIME_DIR/podman/podman.sock``. Without one that answers, or without the image loaded
into it, every test is skipped with what is missing.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

import anyio
import docker
import docker.errors
import pytest

from sandbox import exec as executor
from sandbox.backends import docker as dockerb
from sandbox.backends.docker.runtime import EngineTraits, create_container, traits
from sandbox.errors import BackendUnavailable, GuaranteeUnavailable
from tests.conftest import make_profile, own_like_a_checkout

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

MIB = 1 << 20
Podman: TypeAlias = "tuple[dockerb.DockerBackend, EngineTraits]"  # a backend pointed at Podman, and its traits


def _candidates() -> list[str]:
    explicit = os.environ.get("SANDBOX_PODMAN_HOST")
    if explicit:
        return [explicit]
    found = [os.environ["DOCKER_HOST"]] if os.environ.get("DOCKER_HOST", "").startswith("unix://") else []
    if os.geteuid() == 0:
        found.append("unix:///run/podman/podman.sock")
    runtime_dir = os.environ.get("XDG_RUNTIME_DIR") or f"/run/user/{os.geteuid()}"
    found.append(f"unix://{runtime_dir}/podman/podman.sock")
    return found


def _podman_host() -> tuple[str, EngineTraits]:
    """The first candidate socket that answers as Podman, or a skip naming what was tried."""
    tried = []
    for host in _candidates():
        path = host.removeprefix("unix://")
        if not Path(path).exists():
            tried.append(f"{path}: no such socket")
            continue
        try:
            # docker-py leaves a unix socket that refused its connect unclosed (a ResourceWarning at
            # teardown, an error): one plain connect first, closed whatever happens.
            with socket.socket(socket.AF_UNIX) as probe:
                probe.settimeout(10)
                probe.connect(path)
            with contextlib.closing(docker.DockerClient(base_url=host, timeout=10)) as client:
                found = traits(client)
        except (docker.errors.DockerException, OSError) as exc:
            tried.append(f"{path}: {str(exc).splitlines()[0][:120]}")
            continue
        if found.podman:
            return host, found
        tried.append(f"{path}: {found.name} {found.version}, not Podman")
    pytest.skip("no Podman API socket answers here (tests/run-podman.sh --setup starts one): " + "; ".join(tried))


@pytest.fixture
def podman(monkeypatch: pytest.MonkeyPatch) -> Podman:
    """A docker backend of its own (its probe uncached by other tests) pointed at Podman."""
    host, found = _podman_host()
    monkeypatch.setenv("DOCKER_HOST", host)
    monkeypatch.delenv("DOCKER_TLS_VERIFY", raising=False)
    backend = dockerb.DockerBackend()
    report = backend.probe()
    if not report.available:
        pytest.skip(f"the docker backend cannot use Podman at {host}: {report.reason}")
    return backend, found


@pytest.fixture
def client(podman: Podman) -> Iterator[docker.DockerClient]:  # noqa: ARG001
    with contextlib.closing(dockerb.connect()) as c:
        yield c


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    (root / "README.md").write_text("# sample\n")
    own_like_a_checkout(root)
    return root


@pytest.fixture
async def jails() -> AsyncIterator[list[dockerb.DockerJail]]:
    opened: list[dockerb.DockerJail] = []
    yield opened
    for jail in opened:
        await jail.aclose()


async def open_jail(
    podman: Podman, ws: Path, opened: list[dockerb.DockerJail], **overrides: object
) -> dockerb.DockerJail:
    # Limits the engine may not enforce stay unset here: those are test_limits' and the check's.
    base = {"limits.memory": None, "limits.pids": None, "limits.cpus": None}
    jail = await podman[0].open_jail(ws, make_profile(**{**base, **overrides}))
    assert isinstance(jail, dockerb.DockerJail)
    opened.append(jail)
    return jail


def jail_containers(client: docker.DockerClient, jail_id: str) -> list[str]:
    found = client.api.containers(all=True, filters={"label": f"{dockerb.LABEL_JAIL}={jail_id}"})
    return [str(row["Id"]) for row in found]


# --- the engine -----------------------------------------------------------------------------


def test_the_engine_is_podman_rootless_exactly_when_we_are_not_root(
    podman: Podman,
) -> None:
    _, found = podman
    assert found.podman and re.match(r"\d+\.\d+", found.version), found
    # Our own user's socket: root's engine is rootful, an ordinary user's rootless.
    assert found.rootless == (os.geteuid() != 0), found


# What a container shows of its cgroup limits, v1 or v2, whichever it has, and of its rlimits.
LIMITS_SEEN = r"""
for f in memory/memory.limit_in_bytes memory.max pids/pids.max pids.max cpu/cpu.cfs_quota_us cpu.max; do
  [ -r /sys/fs/cgroup/$f ] && echo "$f $(cat /sys/fs/cgroup/$f)"
done
echo "nproc $(ulimit -u)"; echo "data $(ulimit -d)"; exit 0
"""


def _limits_seen(client: docker.DockerClient) -> dict[str, str]:
    config = {
        "image": dockerb.DEFAULT_IMAGE,
        "entrypoint": ["/bin/bash", "-c"],  # what the jails' containers have: the agent's python3
        "command": [LIMITS_SEEN],
        "labels": dockerb.owner_labels("podman-limits", "call"),
        "mem_limit": 64 * MIB,
        "memswap_limit": 64 * MIB,
        "pids_limit": 64,
        "nano_cpus": 500_000_000,
        "network_mode": "none",
    }
    container = create_container(client, config)
    try:
        container.start()
        client.api.wait(str(container.id), timeout=60)
        text = client.api.logs(str(container.id)).decode()
    finally:
        with contextlib.suppress(docker.errors.NotFound):
            container.remove(force=True)
    seen = dict(line.split(" ", 1) for line in text.splitlines() if " " in line)
    return {
        "memory-limit": seen.get("memory/memory.limit_in_bytes") or seen.get("memory.max", ""),
        "pids-limit": seen.get("pids/pids.max") or seen.get("pids.max", ""),
        "cpu-limit": (seen.get("cpu/cpu.cfs_quota_us") or seen.get("cpu.max", "")).split(" ")[0],
        "nproc": seen.get("nproc", ""),
        "data": seen.get("data", ""),
    }


async def test_the_engine_says_how_it_enforces_limits_and_it_does(client: docker.DockerClient) -> None:
    """EngineTraits' word (cgroup, rlimit stand-in, nothing) against what a container with limits gets."""
    found = traits(client)
    seen = await anyio.to_thread.run_sync(_limits_seen, client)
    how = found.enforcement()
    expected = {"memory-limit": str(64 * MIB), "pids-limit": "64", "cpu-limit": "50000"}
    for (guarantee, value), limit in zip(expected.items(), ("memory", "pids", "cpus"), strict=True):
        enforced = how[limit].how if how else "cgroup"
        if enforced is None:
            assert seen[guarantee] != value, (guarantee, seen, found)
        elif enforced.startswith("cgroup"):
            assert seen[guarantee] == value, (guarantee, seen, found)
        elif enforced.startswith("rlimit NPROC"):
            assert seen["nproc"] == value, (guarantee, seen, found)
        else:
            assert enforced == "rlimit DATA" and seen["data"] == str(64 * 1024), (guarantee, seen, found)


async def test_a_fork_bomb_meets_the_pids_limit_whatever_enforces_it(
    podman: Podman, ws: Path, jails: list[dockerb.DockerJail]
) -> None:
    """An attack: rootless Podman on cgroup v1 has no pids controller; its stand-in must hold too."""
    _, found = podman
    if "pids-limit" in found.limits_unavailable():
        pytest.skip(f"nothing caps processes here: {found.limits_unavailable()['pids-limit']}")
    jail = await open_jail(podman, ws, jails, **{"limits.pids": 40})
    result = await executor.run(jail, ["python3", "-c", COUNT_FORKS], timeout=60)
    assert 0 < int(result.stdout) < 40, result
    assert (await executor.run(jail, ["echo", "still-works"])).stdout == "still-works\n"


# Forks children that wait, until a fork fails or 200 did not; prints how many it got.
COUNT_FORKS = """
import os, time
n = 0
for _ in range(200):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    n += 1
print(n)
"""


async def test_check_claims_no_limit_the_engine_drops_and_refuses_a_profile_asking_for_one(
    podman: Podman, ws: Path
) -> None:
    """``sandbox check`` against the engine's traits: no cgroup limit claimed that the engine drops,
    each limit's mechanism said, and a limit nothing enforces refused rather than dropped."""
    backend, found = podman
    report = backend.probe()
    dropped = found.limits_unavailable()
    for guarantee in ("memory-limit", "pids-limit", "cpu-limit"):
        assert report.guarantees[guarantee] == (guarantee not in dropped), (guarantee, report.to_dict())
    assert report.limits == found.enforcement(), report.to_dict()
    if "cpu-limit" in dropped:
        with pytest.raises(GuaranteeUnavailable, match="limits.cpus"):
            await backend.open_jail(ws, make_profile(**{"limits.cpus": 0.5}))


# --- identity, rlimits, confinement --------------------------------------------------------


async def test_files_written_in_the_jail_belong_to_the_workspace_owner(
    podman: Podman, ws: Path, jails: list[dockerb.DockerJail]
) -> None:
    """Rootless Podman maps its user to the container's root: the command uid must still be the owner's."""
    jail = await open_jail(podman, ws, jails, **{"mount.strategy": "rw"})
    result = await executor.run(jail, ["sh", "-c", "id -u; echo hi > made-here; mkdir -p d/e"])
    owner = ws.stat().st_uid
    assert result.exit_code == 0, result
    assert int(result.stdout) == owner != 0, result
    for made in (ws / "made-here", ws / "d", ws / "d" / "e"):
        assert (made.stat().st_uid, made.stat().st_gid) == (owner, ws.stat().st_gid), made


async def test_rlimits_are_the_profiles_and_podmans_own_defaults_start(
    podman: Podman, ws: Path, jails: list[dockerb.DockerJail]
) -> None:
    """Podman adds nproc and nofile of 1,048,576 to a request naming other ulimits; runc without
    CAP_SYS_RESOURCE cannot raise to that, so the container would not start at all."""
    for lifecycle in ("session", "call"):
        jail = await open_jail(podman, ws, jails, **{"docker.lifecycle": lifecycle, "limits.nofile": 321})
        result = await executor.run(jail, ["sh", "-c", "ulimit -n; ulimit -f"])
        file_size = jail.profile.limits.file_size
        assert file_size is not None
        assert result.stdout.split() == ["321", str(file_size // 512)], (lifecycle, result)


async def test_confinement_holds_inside_a_podman_container(
    podman: Podman, ws: Path, jails: list[dockerb.DockerJail]
) -> None:
    jail = await open_jail(podman, ws, jails)
    script = "grep -E '^(NoNewPrivs|Seccomp|CapEff|CapPrm|CapBnd):' /proc/self/status; touch /usr/x 2>&1; id -u"
    result = await executor.run(jail, ["sh", "-c", script])
    status = dict(re.findall(r"^(\w+):\s+(\S+)$", result.stdout, re.MULTILINE))
    assert status["NoNewPrivs"] == "1" and status["Seccomp"] == "2", result
    assert int(status["CapEff"], 16) == int(status["CapPrm"], 16) == int(status["CapBnd"], 16) == 0, result
    assert "Read-only file system" in result.stdout, result
    assert result.stdout.split()[-1] != "0", result


# --- the agent's socket, labels, auto-remove, gc -------------------------------------------


async def test_a_warm_jail_passes_pipes_over_the_agents_socket(
    podman: Podman,
    ws: Path,
    jails: list[dockerb.DockerJail],
    client: docker.DockerClient,
) -> None:
    """A local Podman binds our socket's directory: calls' pipe ends go to the agent by SCM_RIGHTS."""
    jail = await open_jail(podman, ws, jails)
    assert isinstance(jail, dockerb.WarmJail)
    result = await executor.run(jail, ["sh", "-c", "echo out; echo err >&2; exit 4"])
    assert (result.stdout, result.stderr, result.exit_code) == ("out\n", "err\n", 4), result
    assert jail.stream == "socket", jail.stream_note
    # The agent connected and the host took it: the socket is gone from the container's view.
    listing = await executor.run(jail, ["sh", "-c", "ls -A /run/sandbox-agent 2>&1; echo end"])
    assert "agent.sock" not in listing.stdout, listing
    (cid,) = jail_containers(client, jail.id)
    assert client.containers.get(cid).labels[dockerb.LABEL_LIFECYCLE] == "session"


async def test_closing_or_finishing_leaves_no_container_in_podman(
    podman: Podman,
    ws: Path,
    jails: list[dockerb.DockerJail],
    client: docker.DockerClient,
) -> None:
    warm = await open_jail(podman, ws, jails)
    per_call = await open_jail(podman, ws, jails, **{"docker.lifecycle": "call"})
    await executor.run(warm, ["true"])
    await executor.run(per_call, ["true"])
    assert len(jail_containers(client, warm.id)) == 1
    await warm.aclose()
    await per_call.aclose()
    with anyio.fail_after(15):  # auto-remove is the engine's, off our clock
        while jail_containers(client, warm.id) or jail_containers(client, per_call.id):
            await anyio.sleep(0.1)


async def test_gc_removes_a_dead_executors_container_from_podman(client: docker.DockerClient) -> None:
    async with await anyio.open_process(["true"]) as dead:
        await dead.wait()
    labels = {
        dockerb.LABEL_OWNER: f"{dead.pid}@{os.uname().nodename}",
        dockerb.LABEL_OWNER_STARTED: "1.00",
        dockerb.LABEL_JAIL: "podman-gc-test",
    }
    leftover = client.containers.create(dockerb.DEFAULT_IMAGE, ["true"], labels=labels)
    live = client.containers.create(dockerb.DEFAULT_IMAGE, ["true"], labels=dockerb.owner_labels("podman-live", "call"))
    try:
        removed = await anyio.to_thread.run_sync(dockerb.gc)
        assert leftover.name in removed and live.name not in removed
        with pytest.raises(docker.errors.NotFound):
            client.containers.get(str(leftover.id))
        client.containers.get(str(live.id))
    finally:
        for container in (leftover, live):
            with contextlib.suppress(docker.errors.NotFound):
                container.remove(force=True)


async def test_a_missing_image_in_podman_says_how_to_load_it(podman: Podman, ws: Path) -> None:
    with pytest.raises(BackendUnavailable, match="not on this Docker host"):
        await podman[0].open_jail(ws, make_profile(**{"docker.image": "sandbox-runtime:0.0.0-missing"}))
