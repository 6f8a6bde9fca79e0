"""The tools on the winjob backend: Bash in the profile's shell, and the file tools' runner
(sandbox/_jailside/runner.py) run inside the call's job, as the Linux backends run it in their jail."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import pytest
from anyio.abc import ByteReceiveStream, ObjectReceiveStream

from sandbox import _jailside
from sandbox.backends import base, winjob_command
from sandbox.errors import ShellNotFound
from sandbox.tools import run as tools
from sandbox.tools.bash import run_bash
from sandbox.tools.files import runner_request
from sandbox.tools.params import (
    BashParams,
    EditOp,
    EditParams,
    GlobParams,
    GrepParams,
    LSParams,
    ReadParams,
    WriteParams,
)

if TYPE_CHECKING:
    from pydantic import BaseModel

    from sandbox.backends.base import Jail
    from sandbox.profile import Profile
    from sandbox.tools.replies import RunnerReply

pytestmark = pytest.mark.anyio


async def tool(jail: Jail, params: BaseModel, target: Path) -> RunnerReply:
    return await tools.run_in_jail(jail, runner_request(params, str(target)))


async def test_file_tools_round_trip(jail: Jail, workspace: Path) -> None:
    target = workspace / "notes.txt"
    wrote = await tool(jail, WriteParams(path=str(target), content="alpha\r\nbeta\n"), target)
    assert wrote["ok"], wrote
    assert wrote["resolved"] == str(target)
    assert target.read_bytes() == b"alpha\r\nbeta\n"  # written as given: no text-mode translation
    read = await tool(jail, ReadParams(path=str(target), raw=True), target)
    assert read["ok"] and base64.b64decode(read["details"]["data_base64"]) == b"alpha\r\nbeta\n"
    edited = await tool(jail, EditParams(path=str(target), edits=[EditOp(old_text="beta", new_text="gamma")]), target)
    assert edited["ok"], edited
    assert target.read_bytes() == b"alpha\r\ngamma\n"
    (workspace / "sub").mkdir()
    (workspace / "sub" / "deep.py").write_text("needle = 1\n")
    globbed = await tool(jail, GlobParams(pattern="**/*.py", path=str(workspace)), workspace)
    assert globbed["ok"] and [Path(p) for p in globbed["details"]["paths"]] == [workspace / "sub" / "deep.py"]
    grep = GrepParams(pattern="needle", path=str(workspace), outputMode="files_with_matches")
    grepped = await tool(jail, grep, workspace)
    assert grepped["ok"] and [Path(p) for p in grepped["details"]["files"]] == [workspace / "sub" / "deep.py"]
    listed = await tool(jail, LSParams(path=str(workspace)), workspace)
    assert listed["ok"] and "notes.txt" in listed["content"] and "sub" in listed["content"]


async def test_the_runner_runs_in_the_job(jail: Jail) -> None:
    """Spawned as tools.run spawns it, the runner is a process of the call's job (and dies with it)."""
    send, receive = anyio.create_memory_object_stream[bytes](1)
    program = _jailside.program("runner")
    proc = await jail.spawn(["python3", "-I", "-S", "-c", program], stdin=StreamStdin(receive))
    try:
        for _ in range(100):
            if proc.running_pids():
                break
            await anyio.sleep(0.05)
        assert len(proc.running_pids()) == 1
        await proc.kill_tree(0)
        assert proc.running_pids() == [] and await proc.wait() == -9
    finally:
        send.close()
        receive.close()
        proc.release()


class StreamStdin(ByteReceiveStream):
    """A stdin that never sends: the runner waits on it, in the job."""

    def __init__(self, inner: ObjectReceiveStream[bytes]) -> None:
        self.inner = inner

    async def receive(self, max_bytes: int = 65536) -> bytes:  # noqa: ARG002
        return await self.inner.receive()

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_file_tools_in_a_copy_see_the_copy_under_the_workspace_path(workspace: Path, profile: Profile) -> None:
    (workspace / "a.txt").write_text("host\n")
    copied = profile.with_overrides(**{"mount.strategy": "copy"})
    async with await base.get("winjob").open_jail(workspace, copied) as jail:
        target = workspace / "new.txt"
        wrote = await tool(jail, WriteParams(path=str(target), content="in the copy\n"), target)
        assert wrote["ok"] and wrote["resolved"] == str(target), wrote  # named by its workspace path
        assert str(jail.tree.root) not in wrote["content"]  # type: ignore[union-attr]
        assert not target.exists()  # the host is untouched until apply
        read = await tool(jail, ReadParams(path=str(target)), target)
        assert read["ok"] and "in the copy" in read["content"]
        listed = await tool(jail, GlobParams(pattern="*.txt", path=str(workspace)), workspace)
        assert sorted(Path(p).name for p in listed["details"]["paths"]) == ["a.txt", "new.txt"]
        assert all(Path(p).parent == workspace for p in listed["details"]["paths"])
        changes = await jail.changes()
        assert changes is not None and [c.path for c in changes.changes] == ["new.txt"]


async def test_bash_runs_in_the_profiles_shell(workspace: Path, profile: Profile) -> None:
    assert profile.winjob.shell is None  # unset: the user's default, else the catalogue's first
    async with await base.get("winjob").open_jail(workspace, profile) as jail:
        assert getattr(jail, "shell", None) == "cmd"
        ok = await run_bash(jail, BashParams(command="echo %COMSPEC%", timeout=30), env={})
        assert ok.ok and ok.details["stdout"].strip().lower().endswith("cmd.exe")
    ps = profile.with_overrides(**{"winjob.shell": "powershell"})  # the earlier spelling of windows-powershell
    async with await base.get("winjob").open_jail(workspace, ps) as jail:
        assert getattr(jail, "shell", None) == "windows-powershell"
        assert winjob_command.shell_argv("Get-Date", jail.shell)[0] == "powershell.exe"  # type: ignore[attr-defined]


async def test_bash_shell_is_git_bash_or_refused(workspace: Path, profile: Profile) -> None:
    bashed = profile.with_overrides(**{"winjob.shell": "bash"})
    async with await base.get("winjob").open_jail(workspace, bashed) as jail:
        params = BashParams(command="echo $((6 * 7)); uname -s", timeout=60)
        if winjob_command.git_bash() is None:
            with pytest.raises(ShellNotFound, match="Git for Windows"):
                await run_bash(jail, params, env={})
            return
        result = await run_bash(jail, params, env={})
        assert result.ok and result.details["stdout"].split()[0] == "42", result


def test_git_bash_never_picks_the_wsl_launcher(tmp_path: Path) -> None:
    system = tmp_path / "Windows"
    (system / "System32").mkdir(parents=True)
    (system / "System32" / "bash.exe").write_bytes(b"MZ")
    env = {"SystemRoot": str(system), "PATH": str(system / "System32"), "ProgramFiles": str(system)}
    (system / "Git" / "bin").mkdir(parents=True)
    (system / "Git" / "bin" / "bash.exe").write_bytes(b"MZ")  # under SystemRoot: refused as well
    assert winjob_command.git_bash(env) is None
    programs = tmp_path / "Program Files"
    (programs / "Git" / "bin").mkdir(parents=True)
    (programs / "Git" / "bin" / "bash.exe").write_bytes(b"MZ")
    assert winjob_command.git_bash({**env, "ProgramFiles": str(programs)}) == str(programs / "Git" / "bin" / "bash.exe")
