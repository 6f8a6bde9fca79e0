"""Limits hold for root and for an ordinary user alike, or the call is refused; never silence.

Root gets cgroups here; an ordinary user (tests/run-as-user.sh runs this suite as one) gets the
rlimit fallbacks: RLIMIT_DATA for memory, per process, and RLIMIT_NPROC for processes, which
caps the whole call because each bwrap call has a user namespace of its own. A fork bomb must
leave the executor standing, reporting the call, even when it leaves the user no process at all.
"""

from __future__ import annotations

import json
import os
import resource
from typing import TYPE_CHECKING

import psutil
import pytest

from sandbox import profile as profiles
from sandbox.backends import base, cgroups, confine
from sandbox.errors import GuaranteeUnavailable
from tests.conftest import backend_or_skip, survivors
from tests.integration._cli import sandbox, shell

if TYPE_CHECKING:
    import subprocess
    from pathlib import Path

pytestmark = pytest.mark.bwrap
ALLOCATE_400_MIB = "x = b'1' * (400 << 20); print('allocated', len(x))"
COUNT_FORKS = """import os, time
n = 0
try:
    while n < 200:
        if os.fork() == 0:
            time.sleep(5)
            os._exit(0)
        n += 1
except OSError:
    pass
print(n)
"""
ORDINARY_USER = pytest.mark.skipif(
    os.geteuid() == 0,
    reason="needs an ordinary user: RLIMIT_NPROC does not apply to root (tests/run-as-user.sh runs this suite as one)",
)


@pytest.fixture(autouse=True)
def _need_bwrap() -> None:
    backend_or_skip("bwrap")


def run(*args: str, limit_nproc: int | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    def lower_nproc() -> None:
        if limit_nproc is not None:
            resource.setrlimit(resource.RLIMIT_NPROC, (limit_nproc, limit_nproc))

    return sandbox(*args, text=True, timeout=timeout, preexec_fn=lower_nproc)


def _json(done: subprocess.CompletedProcess[str]) -> dict[str, object]:
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1, (done.stdout, done.stderr)
    out: dict[str, object] = json.loads(lines[0])
    return out


def test_check_says_which_mechanism_enforces_each_limit() -> None:
    done = run("check", "--backend", "bwrap", "--json")
    report = _json(done)["backends"][0]  # type: ignore[index]
    limits = report["limits"]
    assert set(limits) >= {"memory", "pids", "cpus", "cpu_time_s", "file_size", "nofile", "tmp_size"}
    assert limits["cpu_time_s"] == {"enforced": True, "how": "rlimit CPU", "scope": "process"}
    memory = cgroups.hierarchies()["memory"]
    if isinstance(memory, cgroups.Hierarchy):
        assert limits["memory"] == {"enforced": True, "how": memory.mechanism, "scope": "call"}
    else:
        assert limits["memory"] == {"enforced": True, "how": "rlimit DATA", "scope": "process"}
        assert report["guarantees"]["memory-limit"]["ok"] is False
        assert any("Delegate=yes" in line for line in report["advice"])


def test_memory_limit_holds_whatever_enforces_it(workspace: Path) -> None:
    done = run(
        "run", "--memory", "100MiB", "--json", "--workspace", str(workspace), "--", "python3", "-c", ALLOCATE_400_MIB
    )
    out = _json(done)
    assert "allocated" not in str(out["stdout"]) and out["exit_code"] != 0
    if confine.enforcement("bwrap")["memory"].how == "rlimit DATA":
        assert "MemoryError" in str(out["stderr"])
    else:
        assert out["exit_code"] == 137


def test_pids_limit_holds_whatever_enforces_it(workspace: Path) -> None:
    if confine.enforcement("bwrap")["pids"].how is None:
        pytest.skip("no pids cgroup and root: nothing here can cap processes (the next test shows the refusal)")
    done = run("run", "--pids", "50", "--json", "--workspace", str(workspace), "--", "python3", "-c", COUNT_FORKS)
    out = _json(done)
    assert out["exit_code"] == 0, out
    assert 10 < int(str(out["stdout"]).strip()) < 50


@pytest.mark.anyio
async def test_a_limit_nothing_here_can_enforce_is_refused_by_name(
    monkeypatch: pytest.MonkeyPatch, workspace: Path
) -> None:
    found = {**cgroups.hierarchies(), "cpu": "no cpu cgroup (removed for this test)"}
    monkeypatch.setattr(cgroups, "hierarchies", lambda: found)
    monkeypatch.setattr(base.get("bwrap"), "_probed", None)  # forget the cached probe
    prof = profiles.load("default").with_overrides(**{"limits.cpus": 0.5})
    with pytest.raises(GuaranteeUnavailable) as info:
        await base.get("bwrap").open_jail(workspace, prof)
    assert "limits.cpus" in info.value.message and "no cpu cgroup" in info.value.message
    assert "limits.cpus" in info.value.data["missing"]


def test_the_cli_refuses_a_cpu_share_without_a_cpu_cgroup(workspace: Path, tmp_path: Path) -> None:
    if isinstance(cgroups.hierarchies()["cpu"], cgroups.Hierarchy):
        pytest.skip("this process has a writable cpu cgroup: the refusal is shown on a fake tree above")
    prof = tmp_path / "cpus.toml"
    prof.write_text("[limits]\ncpus = 0.5\n")
    done = run("run", "--profile", str(prof), "--workspace", str(workspace), "--", "true")
    assert done.returncode == 125
    assert "GUARANTEE_UNAVAILABLE" in done.stderr and "limits.cpus" in done.stderr


def fork_bomb(
    workspace: Path, marker: str, pids: int, *flags: str, limit_nproc: int | None = None
) -> subprocess.CompletedProcess[str]:
    """``sandbox run`` of a fork bomb allowed ``pids`` processes for 5 s; ``marker`` finds what it left."""
    bomb = f": {marker}; bomb() {{ bomb | bomb & }}; bomb; sleep 3; echo alive"
    return run("run", "--pids", str(pids), "--timeout", "5", *flags, *shell(workspace, bomb), limit_nproc=limit_nproc)


def assert_reported_as_the_calls(done: subprocess.CompletedProcess[str], marker: str) -> None:
    out = _json(done)
    # The shell's own status (2 when it cannot fork), or 124: the call's, reported, not ours.
    assert done.returncode != 125 and out["exit_status"] == done.returncode
    assert survivors(marker) == []


@ORDINARY_USER
def test_fork_bomb_is_capped_per_call_and_reported(workspace: Path, marker: str) -> None:
    assert_reported_as_the_calls(fork_bomb(workspace, marker, 50, "--json"), marker)


def _user_tasks() -> int:
    uid = os.getuid()
    count = 0
    for proc in psutil.process_iter(["uids", "num_threads"]):
        if proc.info["uids"] is not None and proc.info["uids"].real == uid:
            count += proc.info["num_threads"] or 1
    return count


@ORDINARY_USER
def test_fork_bomb_that_exhausts_the_user_leaves_the_executor_reporting(workspace: Path, marker: str) -> None:
    # The executor's own RLIMIT_NPROC a little above what this user runs now: the bomb (allowed
    # 500 per call) takes the rest, and the executor cannot start a thread or a process either.
    headroom = _user_tasks() + 30
    done = fork_bomb(workspace, marker, 500, "--json", limit_nproc=headroom)
    assert_reported_as_the_calls(done, marker)
    assert [p for p in psutil.Process().children() if p.status() == psutil.STATUS_ZOMBIE] == []


@ORDINARY_USER
def test_fork_bomb_that_exhausts_the_user_streams_and_reports_without_a_traceback(workspace: Path, marker: str) -> None:
    # Streaming output is where a thread per call used to die (``can't start new thread``).
    done = fork_bomb(workspace, marker, 500, limit_nproc=_user_tasks() + 30)
    assert "Traceback" not in done.stderr and "can't start new thread" not in done.stderr
    assert done.returncode not in (1, 125), done.stderr[-2000:]
    assert survivors(marker) == []
