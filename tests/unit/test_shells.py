"""The shell catalogue (seed 003 D190): stable ids, the effective shell, the stored default, and a
turn's pinned shell (COMMAND_SHELL_CHANGED, COMMAND_SHELL_INVALID)."""

from __future__ import annotations

import subprocess
import sys
from typing import TYPE_CHECKING

import pytest

from sandbox import shells
from sandbox.errors import CommandShellChanged, CommandShellInvalid
from sandbox.session import Sandbox

if TYPE_CHECKING:
    from pathlib import Path

    from sandbox.backends.fake import FakeBackend


def test_the_catalogue_names_each_shell_by_a_stable_id() -> None:
    assert [(s.id, s.platform, s.dialect) for s in shells.CATALOGUE] == [
        ("bash", "posix", "bash"),
        ("cmd", "windows", "cmd"),
        ("windows-powershell", "windows", "powershell"),
        ("git-bash", "windows", "bash"),
    ]
    # winjob.shell's earlier spellings still name their shells; a path never names one.
    assert shells.find("powershell", "windows") == shells.find("windows-powershell", "windows")
    assert shells.find("bash", "windows") == shells.find("git-bash", "windows")
    assert shells.find("cmd", "posix") is None and shells.find("/bin/zsh", "posix") is None


def test_the_effective_shell_is_the_profiles_then_the_stored_then_the_first(tmp_path: Path) -> None:
    store = shells.ShellStore(tmp_path / "shells.json")
    assert shells.effective("winjob", None, store).id == "cmd"  # the platform's first
    assert shells.effective("bwrap", None, store).id == "bash"
    store.set_default("windows-powershell", platform="windows")
    assert shells.effective("winjob", None, store).id == "windows-powershell"
    assert shells.effective("winjob", "git-bash", store).id == "git-bash"  # the profile's comes first
    # A stored choice this platform has not falls back on purpose, never fails the call.
    assert shells.effective("docker", None, store).id == "bash"


def test_storing_an_unknown_or_foreign_shell_is_command_shell_invalid(tmp_path: Path) -> None:
    store = shells.ShellStore(tmp_path / "shells.json")
    with pytest.raises(CommandShellInvalid, match="not a shell of the catalogue"):
        store.set_default("zsh", platform="posix")
    with pytest.raises(CommandShellInvalid, match="not available on this platform"):
        store.set_default("cmd", platform="posix")
    assert store.default() is None  # nothing was stored
    assert store.set_default("bash", platform="posix").id == "bash" and store.default() == "bash"


def test_a_turn_pins_its_shell() -> None:
    turns = shells.TurnShells()
    cmd, powershell = shells.find("cmd", "windows"), shells.find("windows-powershell", "windows")
    assert cmd is not None and powershell is not None
    assert turns.pin("t1", cmd) == cmd
    with pytest.raises(CommandShellChanged, match="this turn's commands run in cmd"):
        turns.pin("t1", powershell)  # the default changed mid-turn
    assert turns.pin("t2", powershell) == powershell  # the next turn runs in the new one
    with pytest.raises(CommandShellChanged, match="names shell 'cmd'"):
        turns.pin("t2", powershell, requested="cmd")
    turns.end_turn("t1")
    assert turns.pin("t1", powershell) == powershell


@pytest.mark.anyio
async def test_a_bash_call_naming_another_shell_is_refused_before_it_runs(fake: FakeBackend, workspace: Path) -> None:
    async with Sandbox.open(workspace, backend="fake", mode="auto") as s:
        named = await s.call("Bash", {"command": "echo hi", "shell": "bash"})
        other = await s.call("Bash", {"command": "echo hi", "shell": "windows-powershell"})
        path = await s.call("Bash", {"command": "echo hi", "shell": "/bin/zsh"})
    assert named.ok and named.details["stdout"] == "hi\n"
    assert (other.ok, other.error_code) == (False, "COMMAND_SHELL_CHANGED") and "runs in bash" in other.content
    assert path.error_code == "INVALID_ARGUMENT"  # a path is never a shell's identity
    jail = fake.jails[-1]  # this session's (the fake keeps every jail it opened)
    assert [p.call.argv[-1] for p in jail.processes] == ["echo hi"]  # only the first ran


def test_sandbox_shells_default_refuses_a_foreign_id() -> None:
    run = [sys.executable, "-c", "from sandbox.cli import entry; entry()", "shells", "default"]
    refused = subprocess.run([*run, "cmd"], capture_output=True, text=True, check=False, timeout=60)
    assert refused.returncode == 2 and "COMMAND_SHELL_INVALID" in refused.stderr
    stored = subprocess.run([*run, "bash"], capture_output=True, text=True, check=False, timeout=60)
    assert stored.returncode == 0 and stored.stdout == "default shell: bash (bash)\n"
