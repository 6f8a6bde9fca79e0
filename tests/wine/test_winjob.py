"""The winjob backend on Windows: under Wine (tests/run-wine.sh) and natively (windows.yml).

What Wine makes real is tested here for real: the job, the two pipes, the tree kill (checked
here by the job's accounting and by each pid; the Linux side checks ``ps`` in
tests/integration/test_wine.py), breakaway refused, exit and crash codes, the CLI's contract.
Limits and tokens are Windows-only: Wine accepts them without enforcing them.
"""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import pytest

from sandbox import exec as executor
from sandbox.backends import base, winjob_command, winjob_job, winjob_process

if TYPE_CHECKING:
    from sandbox.backends.base import Jail
    from sandbox.profile import Profile

pytestmark = pytest.mark.anyio
PY = sys.executable
ctypes_any: Any = ctypes  # WinDLL exists only on Windows
TREE = str(Path(__file__).with_name("tree.py"))
UNDER_WINE = winjob_job.wine_version() is not None
windows_only = pytest.mark.skipif(
    UNDER_WINE,
    reason=f"needs real Windows: Wine {winjob_job.wine_version()} accepts job limits and tokens, enforces none",
)


def alive(pid: int) -> bool:
    assert sys.platform == "win32"
    k = ctypes_any.WinDLL("kernel32", use_last_error=True)
    k.OpenProcess.restype = ctypes.c_void_p
    handle = k.OpenProcess(0x1000 | 0x00100000, False, pid)  # QUERY_LIMITED_INFORMATION | SYNCHRONIZE
    if not handle:
        return False
    try:
        code = ctypes.c_ulong()
        k.GetExitCodeProcess(ctypes.c_void_p(handle), ctypes.byref(code))
        return code.value == winjob_job.STILL_ACTIVE
    finally:
        k.CloseHandle(ctypes.c_void_p(handle))


def pids_of(pidfile: Path) -> list[int]:
    return [int(line) for line in pidfile.read_text().split()] if pidfile.exists() else []


async def test_probe_is_honest() -> None:
    report = base.get("winjob").probe()
    assert report.available, report.reason
    assert report.guarantees["tree-kill"] and report.guarantees["env-scrubbed"]
    for name in ("net-none", "net-confined", "fs-hidden-home", "no-new-privs"):
        assert not report.guarantees[name], name  # never claimed: no AppContainer; POSIX facilities
    for name in ("fs-write-confined", "fs-readonly-root", "non-root"):  # the token's: real Windows only
        assert report.guarantees[name] is not UNDER_WINE, name
        assert not UNDER_WINE or "Wine accepts file ACLs" in report.reasons[name]
    if UNDER_WINE:
        for name in ("memory-limit", "pids-limit", "cpu-limit"):
            assert not report.guarantees[name] and "Wine" in report.reasons[name]
        assert all(how.how is None for how in report.limits.values())


async def test_streams_apart_and_exit_code(jail: Jail) -> None:
    code = "import sys\nfor i in range(200):\n sys.stdout.write(f'o{i}\\n'); sys.stderr.write(f'e{i}\\n')\nsys.exit(7)"
    result = await executor.run(jail, [PY, "-c", code])
    assert result.exit_code == 7 and result.signal is None
    assert result.stdout.split() == [f"o{i}" for i in range(200)]
    assert result.stderr.split() == [f"e{i}" for i in range(200)]
    assert result.backend == "winjob" and result.mount == "rw"


async def test_large_output_is_bounded(jail: Jail) -> None:
    code = "import sys; sys.stdout.buffer.write(b'x' * (8 << 20))"
    result = await executor.run(jail, [PY, "-c", code], capture_bytes=4096)
    assert result.stdout_bytes == 8 << 20 and result.stdout_truncated and len(result.stdout) < 8192


async def test_stdin_is_fed_then_closed(jail: Jail) -> None:
    result = await executor.run(jail, [PY, "-c", "import sys; print(sys.stdin.read().upper())"], stdin=b"hello")
    assert result.stdout.strip() == "HELLO"
    result = await executor.run(jail, [PY, "-c", "import sys; print(repr(sys.stdin.read()))"])
    assert result.stdout.strip() == "''"  # no stdin given: closed from the start


async def test_environment_is_scrubbed(jail: Jail, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SECRET_TOKEN", "hunter2")
    code = "import json, os; print(json.dumps(dict(os.environ)))"
    env = json.loads((await executor.run(jail, [PY, "-c", code], env={"EXTRA": "1"})).stdout)
    assert "SECRET_TOKEN" not in env and env["EXTRA"] == "1" and env["SANDBOX"] == "1"
    assert env["SYSTEMROOT"] and env["TEMP"].startswith(env["USERPROFILE"].rsplit("\\", 1)[0])


async def test_cwd_is_the_workspace(jail: Jail, workspace: Path) -> None:
    result = await executor.run(jail, [PY, "-c", "import os; print(os.getcwd())"])
    assert Path(result.stdout.strip()) == workspace


async def test_missing_command_is_127(jail: Jail) -> None:
    result = await executor.run(jail, ["no-such-command-here"])
    assert result.exit_code == 127 and "no-such-command-here" in result.stderr


async def test_cmd_builtin_and_batch(jail: Jail, workspace: Path) -> None:
    (workspace / "hello.cmd").write_text("@echo hi %1\r\n@exit /b 4\r\n")
    result = await executor.run(jail, [str(workspace / "hello.cmd"), "there"])
    assert (result.exit_code, result.stdout.strip()) == (4, "hi there")


async def test_crash_reports_the_ntstatus(jail: Jail) -> None:
    result = await executor.run(jail, [PY, "-c", "import faulthandler; faulthandler._read_null()"])
    assert result.exit_code == 0xC0000005, hex(result.exit_code)
    assert winjob_process.ntstatus_name(result.exit_code) == "0xC0000005 STATUS_ACCESS_VIOLATION"


async def test_timeout_kills_the_whole_tree(jail: Jail, tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"
    marker = f"sbx-{uuid.uuid4().hex[:8]}"
    started = time.monotonic()
    result = await executor.run(jail, [PY, TREE, marker, str(pidfile)], timeout=5)
    assert result.timed_out and result.exit_code == 137 and result.signal == 9
    assert "breakaway-refused 5" in result.stdout and "ready" in result.stdout, result
    pids = pids_of(pidfile)
    assert len(pids) == 5, pids  # detached, new group, new console, nested + its grandchild
    assert not [pid for pid in pids if alive(pid)]
    assert time.monotonic() - started < 30


async def test_abort_kills_the_whole_tree(jail: Jail, tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"
    abort = anyio.Event()
    seen: list[bytes] = []

    def on_stdout(chunk: bytes) -> None:
        seen.append(chunk)
        if b"ready" in b"".join(seen):
            abort.set()

    result = await executor.run(jail, [PY, TREE, "sbx-abort", str(pidfile)], abort=abort, on_stdout=on_stdout)
    assert result.aborted and not result.timed_out
    pids = pids_of(pidfile)
    assert len(pids) == 5 and not [pid for pid in pids if alive(pid)]


async def test_cancellation_kills_the_tree(jail: Jail, tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"
    with anyio.move_on_after(6):
        await executor.run(jail, [PY, TREE, "sbx-cancel", str(pidfile)])
    pids = pids_of(pidfile)
    assert pids and not [pid for pid in pids if alive(pid)]


async def test_close_kills_what_runs(workspace: Path, profile: Profile, tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"
    jail = await base.get("winjob").open_jail(workspace, profile)
    proc = await jail.spawn([PY, TREE, "sbx-close", str(pidfile)])
    for _ in range(200):
        if len(pids_of(pidfile)) == 5:
            break
        await anyio.sleep(0.05)
    assert len(proc.running_pids()) >= 5
    await jail.aclose()
    assert not [pid for pid in pids_of(pidfile) if alive(pid)]


async def test_leftovers_of_a_normal_exit_are_killed(jail: Jail, tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"
    code = (
        "import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], "
        f"creationflags=0x8); open({str(pidfile)!r}, 'w').write(str(p.pid))"
    )
    result = await executor.run(jail, [PY, "-c", code])
    assert result.exit_code == 0 and not result.timed_out
    assert not alive(pids_of(pidfile)[0])


async def test_jail_refuses_what_it_cannot_do(workspace: Path, profile: Profile) -> None:
    from sandbox.errors import GuaranteeUnavailable

    backend = base.get("winjob")
    with pytest.raises(GuaranteeUnavailable, match="overlay"):
        await backend.open_jail(workspace, profile.with_overrides(**{"mount.strategy": "overlay"}))
    with pytest.raises(GuaranteeUnavailable, match="network.mode = 'none'"):
        await backend.open_jail(workspace, profile.with_overrides(**{"network.mode": "none"}))
    with pytest.raises(GuaranteeUnavailable, match="fs-hidden-home"):
        backend.check(profile.with_overrides(requires=["tree-kill", "fs-hidden-home"]))
    if UNDER_WINE:
        with pytest.raises(GuaranteeUnavailable, match="fs-write-confined"):
            backend.check(profile.with_overrides(requires=["tree-kill", "fs-write-confined"]))
        with pytest.raises(GuaranteeUnavailable, match="limits.memory"):
            backend.check(profile.with_overrides(**{"limits.memory": "64MiB"}))


@windows_only
async def test_active_process_limit(profile: Profile, workspace: Path) -> None:
    async with await base.get("winjob").open_jail(workspace, profile.with_overrides(**{"limits.pids": 8})) as lim:
        code = (
            "import subprocess, sys\nn = 0\ntry:\n for _ in range(20):\n"
            "  subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); n += 1\n"
            "except OSError: pass\nprint(n)"
        )
        result = await executor.run(lim, [PY, "-c", code])
        assert int(result.stdout) < 8


@windows_only
async def test_job_memory_limit(workspace: Path, profile: Profile) -> None:
    limited = profile.with_overrides(**{"limits.memory": "64MiB"})
    async with await base.get("winjob").open_jail(workspace, limited) as lim:
        result = await executor.run(lim, [PY, "-c", "b = bytearray(256 << 20); print('allocated')"])
        assert "allocated" not in result.stdout and result.exit_code != 0


def test_cli_run_json_contract(workspace: Path, tmp_path: Path) -> None:
    from tests.wine.conftest import PROFILE_TOML

    prof = tmp_path / "windows.toml"
    prof.write_text(PROFILE_TOML)
    base_cmd = [PY, "-m", "sandbox.cli", "run", "--backend", "winjob", "--profile", str(prof)]
    args = ["--workspace", str(workspace), "--json", "--", PY, "-c", "import sys; print('o'); sys.exit(3)"]
    done = subprocess.run([*base_cmd, *args], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 3, done
    result = json.loads(done.stdout)
    assert result["exit_code"] == 3 and result["stdout"] == "o\r\n" and result["backend"] == "winjob"
    refused = subprocess.run(
        [*base_cmd, "--workspace", str(workspace), "--json", "--mount", "overlay", "--", PY, "-c", "pass"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert refused.returncode == 125, refused


def test_cli_run_streams_timeout_and_stdin(workspace: Path, tmp_path: Path) -> None:
    from tests.wine.conftest import PROFILE_TOML

    prof = tmp_path / "windows.toml"
    prof.write_text(PROFILE_TOML)
    run = [PY, "-m", "sandbox.cli", "run", "--backend", "winjob", "--profile", str(prof), "--workspace", str(workspace)]
    code = "import sys; data = sys.stdin.read(); print(data.upper()); print('err', file=sys.stderr)"
    done = subprocess.run(
        [*run, "--", PY, "-c", code], input="piped", capture_output=True, text=True, timeout=120, check=False
    )
    assert (done.returncode, done.stdout.strip(), done.stderr.strip()) == (0, "PIPED", "err"), done
    slow = [*run, "--timeout", "2", "--json", "--", PY, "-c", "import time; time.sleep(60)"]
    done = subprocess.run(slow, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 124, done
    assert json.loads(done.stdout)["timed_out"]


async def test_bash_tool_runs_cmd(jail: Jail, workspace: Path) -> None:
    from sandbox.tools.bash import run_bash
    from sandbox.tools.params import BashParams

    params = BashParams(command='echo "quoted arg" & echo to-err 1>&2 & cd & exit /b 2', timeout=30)
    result = await run_bash(jail, params, env={})
    assert not result.ok and result.error_code == "TOOL_FAILED"
    assert result.details["exit_code"] == 2
    out = result.details["stdout"].splitlines()
    assert out[0].strip() == '"quoted arg"' and Path(out[1].strip()) == workspace
    assert result.details["stderr"].strip() == "to-err"
    ok = await run_bash(jail, BashParams(command=f'"{PY}" -c "print(6 * 7)"', timeout=30), env={})
    assert ok.ok and ok.details["stdout"].strip() == "42"


async def test_bash_tool_timeout_kills_the_tree(jail: Jail, tmp_path: Path) -> None:
    from sandbox.tools.bash import run_bash
    from sandbox.tools.params import BashParams

    pidfile = tmp_path / "pids"
    params = BashParams(command=f'"{PY}" "{TREE}" sbx-bash "{pidfile}"', timeout=4)
    result = await run_bash(jail, params, env={})
    assert result.error_code == "TIMEOUT"
    pids = pids_of(pidfile)
    assert len(pids) == 5 and not [pid for pid in pids if alive(pid)]


def test_shell_argv_choices() -> None:
    assert winjob_command.shell_argv("dir", "powershell")[-2:] == ["-Command", "dir"]
    assert (
        winjob_command.command_line(winjob_command.shell_argv('echo "a b"', comspec="cmd.exe"))
        == 'cmd.exe /d /s /c "echo "a b""'
    )
    from sandbox.errors import CommandShellInvalid

    assert winjob_command.shell_argv("dir", "windows-powershell")[0] == "powershell.exe"  # the catalogue's id
    with pytest.raises(CommandShellInvalid):  # no shell of the catalogue (seed 003 D190)
        winjob_command.shell_argv("x", "fish")
