"""Docker with gVisor (``[docker] runtime = "runsc"``), against a real dockerd with runsc registered.

What is claimed and attacked here: ``sandbox check`` says whether runsc is installed and
registered, and how (its platform), and grants ``kernel-isolated`` only to a profile whose
runtime is gVisor, with the reason otherwise; a runtime the engine does not know is refused
before any container starts, even past a stale check; the kernel a command meets is gVisor's
Sentry (its release, its ``/proc/version``, its boot id), and the command is no process of the
host's. What gVisor changes is checked as it is, not as runc's: the warm agent keeps its socket
link (the gofer is the peer), the memory and pids limits end the whole sandbox (the next call
gets a new container), the file size limit holds, ``cpu_time_s`` is refused, our seccomp filter
still loads inside, a fifo stays in the Sentry, and closed jails leave no runsc process.

The contract and attack suites run on gVisor too (``docker-runsc``, see tests/conftest.py), less
what it declares there (``RUNSC_DECLARED``); the declared ones are checked here in their gVisor form.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import psutil
import pytest

from sandbox import exec as executor
from sandbox.backends.docker import gvisor
from sandbox.backends.docker.config import LABEL_JAIL
from sandbox.backends.docker.links import SocketLink
from sandbox.backends.docker.percall import PerCallJail
from sandbox.backends.docker.warm import AgentJail, WarmJail
from sandbox.errors import BackendUnavailable, GuaranteeUnavailable, InvalidArgument
from tests.conftest import RUNSC, in_gvisor, make_profile, own_like_a_checkout, runsc_missing, survivors
from tests.integration._docker import Jails, docker_or_skip
from tests.integration.test_seccomp import PROBE, _not_refused, _numbers

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from sandbox.backends import docker as dockerb

pytestmark = [pytest.mark.docker, pytest.mark.anyio]
SANDBOX = str(Path(sys.executable).with_name("sandbox"))
# A profile on gVisor: limits.cpu_time_s at the schema's default (not asked for), which gVisor cannot hold.
ON_RUNSC: dict[str, Any] = {"docker.runtime": RUNSC, "limits.cpu_time_s": 300}
# What the kernel says of itself, read the same way on the host and in the jail.
KERNEL = "uname -r; cat /proc/version; cat /proc/sys/kernel/random/boot_id 2>/dev/null || echo no-boot-id"


@pytest.fixture
def docker_backend() -> dockerb.DockerBackend:
    return docker_or_skip()


@pytest.fixture
def on_gvisor(docker_backend: dockerb.DockerBackend) -> dockerb.DockerBackend:
    missing = runsc_missing(docker_backend)
    if missing is not None:
        pytest.skip(missing)
    return docker_backend


@pytest.fixture
async def jails(on_gvisor: dockerb.DockerBackend, workspace: Path) -> AsyncIterator[Jails[AgentJail]]:
    own_like_a_checkout(workspace)
    async with Jails(on_gvisor, workspace, (WarmJail, PerCallJail)) as opened:
        yield opened


def _registered(backend: dockerb.DockerBackend) -> gvisor.RuntimeChoice:
    spec = backend.probe().details["gvisor"]["registered"][RUNSC]
    return gvisor.RuntimeChoice(RUNSC, spec["path"], tuple(spec["args"]))


def _check(*args: str) -> dict[str, Any]:
    done = subprocess.run([SANDBOX, "check", "--backend", "docker", "--json", *args], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    found: dict[str, Any] = json.loads(done.stdout)["backends"][0]
    return found


def _profile_file(tmp_path: Path, runtime: str) -> Path:
    path = tmp_path / f"{runtime}.toml"
    path.write_text(f'[docker]\nruntime = "{runtime}"\n')
    return path


# --- sandbox check -------------------------------------------------------------------------


def test_check_says_runsc_is_installed_registered_and_on_which_platform(on_gvisor: dockerb.DockerBackend) -> None:
    report = _check()
    found = report["details"]["gvisor"]
    assert found["installed"]["path"].endswith("/runsc") and found["installed"]["version"]
    runsc = found["registered"][RUNSC]
    assert runsc["path"].endswith("runsc") and runsc["platform"], runsc
    assert runsc == _registered(on_gvisor).to_dict() | {"name": RUNSC}
    said = next(note for note in report["notes"] if note.startswith("gVisor: "))  # in the text too
    assert f"registered with the engine as runsc: platform {runsc['platform']}" in said, said
    # The engine's default runtime (runc): no kernel isolation, and it says why.
    assert report["details"]["runtime"]["name"] == "runc"
    isolated = report["guarantees"]["kernel-isolated"]
    assert isolated == {"ok": False, "why_not": "commands make system calls to the host's kernel (runc)"}


def test_check_grants_kernel_isolated_to_a_runsc_profile_and_says_what_changes(
    on_gvisor: dockerb.DockerBackend,  # noqa: ARG001 - skips
    tmp_path: Path,
) -> None:
    report = _check("--profile", str(_profile_file(tmp_path, RUNSC)))
    assert report["available"] and report["guarantees"]["kernel-isolated"] == {"ok": True}
    assert report["details"]["runtime"]["name"] == RUNSC
    notes = " ".join(report["notes"])
    assert "Sentry" in notes and "user-space kernel" in notes and "pids" in notes
    assert report["limits"]["cpu_time_s"]["enforced"] is False
    assert "the whole sandbox" in report["limits"]["memory"]["how"]
    assert report["guarantees"]["net-transparent"]["ok"] is False


def test_check_calls_an_unregistered_runtime_unavailable(docker_backend: dockerb.DockerBackend, tmp_path: Path) -> None:
    report = _check("--profile", str(_profile_file(tmp_path, "no-such-runtime")))
    assert not report["available"]
    assert "no runtime of that name" in report["reason"] and "runc" in report["reason"], report["reason"]
    assert report["details"]["runtimes"] == sorted(docker_backend.probe().details["runtimes"])


# --- fail closed ---------------------------------------------------------------------------


def _our_containers() -> set[str]:
    done = subprocess.run(
        ["docker", "ps", "-aq", "--no-trunc", "--filter", f"label={LABEL_JAIL}"], capture_output=True, text=True
    )
    return set(done.stdout.split())


async def test_an_unregistered_runtime_is_refused_and_nothing_starts(
    docker_backend: dockerb.DockerBackend, workspace: Path
) -> None:
    own_like_a_checkout(workspace)
    before = await anyio.to_thread.run_sync(_our_containers)
    with pytest.raises(BackendUnavailable) as refused:
        await docker_backend.open_jail(workspace, make_profile(**{"docker.runtime": "no-such-runtime"}))
    assert refused.value.code == "BACKEND_UNAVAILABLE"
    assert "no-such-runtime" in refused.value.message and "no runtime of that name" in refused.value.message
    assert await anyio.to_thread.run_sync(_our_containers) <= before


async def test_a_stale_check_still_refuses_an_unregistered_runtime(
    on_gvisor: dockerb.DockerBackend, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check's report is cached for the process; the engine is asked again as the jail opens."""
    own_like_a_checkout(workspace)
    runsc = on_gvisor.probe_for(make_profile(**ON_RUNSC))
    monkeypatch.setattr(on_gvisor, "probe_for", lambda _profile: runsc)
    before = await anyio.to_thread.run_sync(_our_containers)
    with pytest.raises(BackendUnavailable) as refused:
        await on_gvisor.open_jail(workspace, make_profile(**{**ON_RUNSC, "docker.runtime": "no-such-runtime"}))
    assert "no runtime of that name" in refused.value.message
    assert await anyio.to_thread.run_sync(_our_containers) <= before


async def test_kernel_isolated_is_refused_under_runc_and_given_by_runsc(
    on_gvisor: dockerb.DockerBackend, workspace: Path
) -> None:
    own_like_a_checkout(workspace)
    wants = make_profile(requires=["kernel-isolated", "non-root"], **{"limits.cpu_time_s": 300})
    with pytest.raises(GuaranteeUnavailable) as refused:
        await on_gvisor.open_jail(workspace, wants)
    assert refused.value.data["missing"] == {
        "kernel-isolated": "commands make system calls to the host's kernel (runc)"
    }
    async with await on_gvisor.open_jail(workspace, wants.with_overrides(**{"docker.runtime": RUNSC})) as jail:
        result = await executor.run(jail, ["uname", "-r"])
    assert result.exit_code == 0 and result.stdout.strip() != os.uname().release


async def test_a_profile_setting_cpu_time_is_refused_on_gvisor(
    on_gvisor: dockerb.DockerBackend, workspace: Path
) -> None:
    with pytest.raises(GuaranteeUnavailable) as refused:
        await on_gvisor.open_jail(workspace, make_profile(**{"docker.runtime": RUNSC, "limits.cpu_time_s": 60}))
    assert "RLIMIT_CPU" in refused.value.data["missing"]["limits.cpu_time_s"]


async def test_host_network_is_refused_where_runsc_has_none(on_gvisor: dockerb.DockerBackend, workspace: Path) -> None:
    if _registered(on_gvisor).network != "none":
        pytest.skip(f"runsc is registered with --network={_registered(on_gvisor).network}: host networking can run")
    own_like_a_checkout(workspace)
    with pytest.raises(InvalidArgument) as refused:
        await on_gvisor.open_jail(workspace, make_profile(**{**ON_RUNSC, "network.mode": "host"}))
    assert "--network=none" in refused.value.message and refused.value.data["key"] == "network.mode"


# --- the kernel the command meets ------------------------------------------------------------


async def test_the_kernel_a_command_meets_is_gvisors_not_the_hosts(jails: Jails[AgentJail], marker: str) -> None:
    host = (await anyio.run_process(["sh", "-c", KERNEL])).stdout.decode().splitlines()
    runc = await jails.open(**{"limits.cpu_time_s": 300})
    same = (await executor.run(runc, ["sh", "-c", KERNEL])).stdout.splitlines()
    assert same[0] == host[0] and same[2] == host[2]  # under runc: the host's own kernel, and its boot
    jail = await jails.open(**ON_RUNSC)
    seen = (await executor.run(jail, ["sh", "-c", KERNEL])).stdout.splitlines()
    assert len(seen) == 3 and all(ours != theirs for ours, theirs in zip(seen, host, strict=True)), (seen, host)
    # The command is a process of the Sentry's, not of the host's: nothing on the host carries its marker.
    proc = await jail.spawn(["sleep", marker])
    try:
        deadline = time.monotonic() + 20
        while not in_gvisor(marker):
            assert time.monotonic() < deadline, "the command never showed in the sandbox"
            await anyio.sleep(0.1)
        host_side = [p.pid for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or [])]
        assert host_side == []
    finally:
        await proc.kill_tree(0)
        proc.release()
    assert survivors(marker) == []


async def test_our_seccomp_filter_still_loads_inside_the_sandbox(jails: Jails[AgentJail]) -> None:
    jail = await jails.open(**ON_RUNSC)
    result = await executor.run(jail, ["python3", "-c", PROBE, _numbers()])
    assert result.exit_code == 0, result.stderr
    assert _not_refused(json.loads(result.stdout)) == {}


async def test_no_new_privileges_no_capabilities_and_a_session_of_its_own(jails: Jails[AgentJail]) -> None:
    """test_contracts' identity checks, read from inside: gVisor's /proc/self/status has no NoNewPrivs
    line (prctl says), and its sessions are the Sentry's (the command leads one, with no terminal)."""
    jail = await jails.open(**ON_RUNSC)
    script = (
        "import ctypes, os\n"
        "print(os.getuid(), ctypes.CDLL(None).prctl(39, 0, 0, 0, 0), os.getsid(0) == os.getpid())\n"
        "print([l.split()[1] for l in open('/proc/self/status') if l.startswith('CapEff')][0])\n"
        "try: os.open('/dev/tty', os.O_RDWR); print('tty')\n"
        "except OSError: print('no tty')\n"
    )
    result = await executor.run(jail, ["python3", "-c", script])
    assert result.stdout.split("\n")[:3] == ["1000 1 True", "0000000000000000", "no tty"], result


# --- the agent's link ------------------------------------------------------------------------


async def test_the_warm_agent_keeps_its_socket_link(jails: Jails[AgentJail]) -> None:
    jail = await jails.open(**ON_RUNSC)
    assert isinstance(jail, WarmJail)
    result = await executor.run(jail, ["sh", "-c", "echo out; echo err >&2"])
    assert (result.stdout, result.stderr) == ("out\n", "err\n")
    assert isinstance(jail._link, SocketLink) and jail.stream_note == ""


async def test_without_host_sockets_the_calls_take_the_attach_stream(
    jails: Jails[AgentJail], monkeypatch: pytest.MonkeyPatch
) -> None:
    resolve = gvisor.resolve

    def without_host_uds(*args: Any) -> gvisor.RuntimeChoice:
        found = resolve(*args)
        kept = tuple(arg for arg in found.args if "host-uds" not in arg)
        return gvisor.RuntimeChoice(found.name, found.path, kept, found.named)

    monkeypatch.setattr(gvisor, "resolve", without_host_uds)
    jail = await jails.open(**ON_RUNSC)
    result = await executor.run(jail, ["sh", "-c", "echo out; echo err >&2"])
    assert (result.stdout, result.stderr) == ("out\n", "err\n")
    assert isinstance(jail, WarmJail) and not isinstance(jail._link, SocketLink)
    assert "--host-uds=open" in jail.stream_note


# --- limits, as gVisor holds them ------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("limit", "bomb", "oom"),
    [
        ({"limits.pids": 64}, "bomb() { bomb | bomb & }; bomb; sleep 5", False),
        ({"limits.memory": "64MiB"}, "python3 -c 'x = []\nwhile True: x.append(bytearray(1 << 20))'", True),
    ],
    ids=["pids", "memory"],
)
async def test_a_limit_reached_ends_the_sandbox_and_the_next_call_gets_a_new_one(
    jails: Jails[AgentJail], limit: dict[str, Any], bomb: str, oom: bool
) -> None:
    jail = await jails.open(**ON_RUNSC, **limit)
    assert isinstance(jail, WarmJail)
    first = jail.container_id
    with pytest.raises(BackendUnavailable) as ended:
        await executor.run(jail, ["sh", "-c", bomb], timeout=60)
    assert gvisor.ENDS_SANDBOX in ended.value.message
    assert bool(ended.value.data.get("oom_killed")) == oom, ended.value.data
    after = await executor.run(jail, ["sh", "-c", "echo still-works"])
    assert after.stdout == "still-works\n" and jail.container_id not in (None, first)


async def test_the_file_size_limit_holds(jails: Jails[AgentJail]) -> None:
    jail = await jails.open(**ON_RUNSC, **{"limits.file_size": "1MiB"})
    result = await executor.run(jail, ["sh", "-c", 'head -c 4194304 /dev/zero > "$TMPDIR/big"; wc -c < "$TMPDIR/big"'])
    assert result.stdout.strip() == str(1 << 20) and "File size limit exceeded" in result.stderr, result


async def test_tmp_is_bounded_by_its_size(jails: Jails[AgentJail]) -> None:
    jail = await jails.open(**ON_RUNSC, **{"limits.tmp_size": "16MiB"})
    result = await executor.run(jail, ["sh", "-c", "head -c 64000000 /dev/zero > /tmp/x; wc -c < /tmp/x"])
    assert result.stdout.strip() == str(16 << 20) and "No space left" in result.stderr, result


# --- what reaches the host -------------------------------------------------------------------


async def test_a_fifo_made_in_the_workspace_never_reaches_the_host(jails: Jails[AgentJail], workspace: Path) -> None:
    jail = await jails.open(**ON_RUNSC, **{"mount.strategy": "rw"})
    result = await executor.run(jail, ["sh", "-c", "mkfifo fifo && test -p fifo && echo fifo"])
    assert result.stdout == "fifo\n", result
    assert not (workspace / "fifo").exists()
    copied = await jails.open(**ON_RUNSC, **{"mount.strategy": "copy"})
    await executor.run(copied, ["mkfifo", "fifo2"])
    changes = await copied.changes()
    assert changes is not None and not any("fifo" in change.path for change in changes.changes)


def _runsc_processes(ids: set[str]) -> list[int]:
    """Host pids of runsc's processes (the Sentry, the gofer) serving any of these containers."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if cmdline.startswith("runsc") and any(cid in cmdline for cid in ids):
            found.append(proc.pid)
    return found


@pytest.mark.slow
@pytest.mark.parametrize("lifecycle", ["session", "call"])
async def test_closed_jails_leave_no_container_nor_runsc_process(
    on_gvisor: dockerb.DockerBackend, workspace: Path, marker: str, lifecycle: str
) -> None:
    own_like_a_checkout(workspace)
    ids: set[str] = set()
    for _ in range(3):
        prof = make_profile(**ON_RUNSC, **{"docker.lifecycle": lifecycle, "timeouts.kill_grace_s": 0.1})
        async with await on_gvisor.open_jail(workspace, prof) as jail:
            assert isinstance(jail, AgentJail)
            await executor.run(jail, ["sh", "-c", f"setsid sleep {marker} & sleep {marker}"], timeout=1)
            with anyio.move_on_after(0.5):
                await executor.run(jail, ["sleep", marker], timeout=30)
            listed = await anyio.run_process(
                ["docker", "ps", "-q", "--no-trunc", "--filter", f"label={LABEL_JAIL}={jail.id}"]
            )
            ids |= set(listed.stdout.decode().split())
    assert ids, "no container of the jails was seen running"
    deadline = time.monotonic() + 20
    while _runsc_processes(ids) and time.monotonic() < deadline:
        await anyio.sleep(0.2)
    assert _runsc_processes(ids) == []
    assert not ids & await anyio.to_thread.run_sync(_our_containers)
    assert survivors(marker) == []
