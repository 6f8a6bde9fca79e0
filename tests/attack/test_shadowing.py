"""Attack class: shadow our machinery (issue 31, category 1, "Nothing of ours is ever found through a
path the workspace controls").

A hostile repository ships the interpreters and shells our own programs start by name in the
jail: ``.venv/bin/python3`` and ``node_modules/.bin/python3`` (the jail's PATH puts the
workspace's tool directories first, for the user's commands), and ``sh`` and ``bash`` beside them.
Each is a script that records that it ran (a file in the workspace, as the jail sees it) and
leaves a sleeping survivor, then execs the real program so that nothing looks amiss. Then the
session uses every tool (Read, Write, Edit, LS, Glob, Grep, Bash, and the allowlist network's
forwarder): the tools must work and the hostile programs must never have run, on both backends,
warm and per call; the run as an ordinary user (``tests/run-as-user.sh``) gives the user axis.
The user's own ``python3`` in Bash still finds the workspace's, as in an activated venv.
"""

from __future__ import annotations

import json
import os
import shlex
from typing import TYPE_CHECKING

import pytest

from sandbox import datadir
from sandbox import exec as executor
from sandbox.backends import jailpython
from sandbox.errors import BackendUnavailable
from sandbox.session import Sandbox
from sandbox.tools.bash import run_bash
from sandbox.tools.params import BashParams
from tests.attack.conftest import mode_profile
from tests.conftest import JailFactory, own_like_a_checkout, survivors

if TYPE_CHECKING:
    from pathlib import Path

    from sandbox import profile as profiles
    from sandbox.backends import base

pytestmark = pytest.mark.anyio

TOOL_DIRS = (".venv/bin", "node_modules/.bin")
SHADOWED = ("python3", "python", "sh", "bash", "env")
PWNED = "pwned"


def _hostile(workspace: Path, name: str, marker: str) -> str:
    """A stand-in for ``name``: it records that it ran, leaves a survivor, then runs the real one.

    The record goes to the workspace (as the jail sees it) and to every session's scratch
    directory, which every mount mode and lifecycle binds writable at its host path."""
    real = {"sh": "/bin/sh", "bash": "/bin/bash", "env": "/usr/bin/env"}.get(name, "/usr/bin/python3")
    places = f"{shlex.quote(str(workspace))} {shlex.quote(str(datadir.data_dir()))}/scratch/*"
    return (
        "#!/bin/sh\n"
        f'for d in {places}; do echo {name} >> "$d/{PWNED}"; done 2>/dev/null\n'
        f"(sleep {marker} </dev/null >/dev/null 2>&1 &)\n"
        f'exec {real} "$@"\n'
    )


def plant(workspace: Path, marker: str, backend: base.Backend, *, linked: bool = False) -> None:
    """The hostile tool directories; ``linked``: each name a symlink to one writable script."""
    if linked:  # the link's target is a file the jail can write (the workspace's own)
        target = workspace / "evil.sh"
        target.write_text(_hostile(workspace, "python3", marker))
        target.chmod(0o777)
    for folder in TOOL_DIRS:
        bin_dir = workspace / folder
        bin_dir.mkdir(parents=True)
        for name in SHADOWED:
            path = bin_dir / name
            if linked and name.startswith("python"):
                path.symlink_to(os.path.relpath(target, bin_dir))
            else:
                path.write_text(_hostile(workspace, name, marker))
                path.chmod(0o755)
    own_like_a_checkout(workspace, backend.name)  # owned as the workspace fixture owns it


async def assert_never_ran(box: Sandbox, workspace: Path, marker: str) -> None:
    """No record in the scratch directory, nor in the jail's view of the workspace, and no survivor."""
    assert not (box.scratch / PWNED).exists(), f"a planted program ran: {(box.scratch / PWNED).read_text()!r}"
    seen = await executor.run(box.jail, ["/bin/sh", "-c", f"cat {shlex.quote(str(workspace / PWNED))} 2>&1 || true"])
    assert "No such file" in seen.stdout, f"a planted program ran: {seen.stdout!r}"
    assert not survivors(marker), "a planted program left a process behind"


async def use_every_tool(box: Sandbox, workspace: Path, *, writes: bool) -> None:
    ws = str(workspace)
    calls: list[tuple[str, dict[str, object], str]] = [
        ("Read", {"path": f"{ws}/README.md"}, "sample"),
        ("Write", {"path": f"{ws}/notes.txt", "content": "one\n"}, ""),
        ("Edit", {"path": f"{ws}/notes.txt", "edits": [{"old_text": "one", "new_text": "two"}]}, ""),
        ("Read", {"path": f"{ws}/notes.txt"}, "two"),
        ("LS", {"path": ws}, "README.md"),
        ("Glob", {"pattern": "**/*.py", "path": ws}, "app.py"),
        ("Grep", {"pattern": "hello", "path": ws}, "app.py"),
        ("Bash", {"command": "echo from-bash"}, "from-bash"),
    ]
    if not writes:  # ro: a Write is refused by the mount, which is not this attack
        calls = [call for call in calls if call[0] not in ("Write", "Edit") and "notes" not in str(call[1])]
    for name, args, expected in calls:
        result = await box.call(name, args)
        assert result.ok, (name, result)
        assert expected in result.content, (name, result.content)


@pytest.mark.parametrize("linked", [False, True], ids=["scripts", "symlinks"])
async def test_planted_interpreters_never_run_our_machinery(
    backend: base.Backend, workspace: Path, mode: str, marker: str, linked: bool
) -> None:
    plant(workspace, marker, backend, linked=linked)
    async with Sandbox.open(workspace, profile=mode_profile(mode, backend=backend.name), mode="auto") as box:
        await use_every_tool(box, workspace, writes=mode != "ro")
        await assert_never_ran(box, workspace, marker)


async def test_the_forwarder_is_not_shadowed(backend: base.Backend, workspace: Path, marker: str) -> None:
    """An allowlist jail starts every command beside our network forwarder (a Python program)."""
    plant(workspace, marker, backend)
    prof: profiles.Profile = mode_profile(
        "rw", backend=backend.name, **{"network.mode": "allowlist", "network.allow": ["example.test"]}
    )
    async with Sandbox.open(workspace, profile=prof, mode="auto") as box:
        result = await box.call("Bash", {"command": "echo $HTTPS_PROXY"})
        assert result.ok, result
        assert "3128" in result.content
        await assert_never_ran(box, workspace, marker)


async def test_the_users_own_python3_still_comes_from_the_workspace(
    backend: base.Backend, workspace: Path, marker: str
) -> None:
    """The jail's PATH keeps the workspace's tool directories for the user's commands."""
    plant(workspace, marker, backend)
    async with Sandbox.open(workspace, profile=mode_profile("rw", backend=backend.name), mode="auto") as box:
        command = BashParams(command="command -v python3; python3 -c 'print(6 * 7)'")
        result = await run_bash(box.jail, command, env={})  # the policy is not this test's subject
        assert result.ok, result
        assert result.content.splitlines()[:2] == [f"{workspace}/.venv/bin/python3", "42"]
        assert (workspace / PWNED).read_text() == "python3\n"  # the user's command ran it, as asked


async def test_an_interpreter_the_jail_could_write_is_refused(
    backend: base.Backend, workspace: Path, monkeypatch: pytest.MonkeyPatch, open_jail: JailFactory
) -> None:
    """Fail closed: were the only interpreter one the workspace holds, no jail opens (none runs it)."""
    planted = workspace / ".venv" / "bin" / "python3"
    plant(workspace, "0", backend)
    monkeypatch.setattr(jailpython, "_kept", None)
    monkeypatch.setattr(jailpython, "CANDIDATES", (str(planted),))  # bubblewrap's: the host's
    monkeypatch.setattr(jailpython, "IMAGE_PYTHON", str(planted))  # Docker's: the image's
    with pytest.raises(BackendUnavailable, match=r"interpreter|python3"):
        await open_jail(mode_profile("rw"))
    assert not (workspace / PWNED).exists()


async def test_a_plugins_bare_interpreter_is_not_the_workspaces(
    backend: base.Backend, workspace: Path, tmp_path: Path, marker: str
) -> None:
    """A plugin declared as ``["python3", "${PLUGIN_DIR}/tool.py"]`` is the user's tool: its
    ``python3`` is the system's, whatever the workspace plants on the user's PATH."""
    plant(workspace, marker, backend)
    kit = tmp_path / "plugins" / "kit"
    kit.mkdir(parents=True)
    (kit / "tool.py").write_text("import json, sys\njson.load(sys.stdin)\nprint(json.dumps({'said': 'hi'}))\n")
    tool = {"name": "hi", "risk": "low", "command": ["python3", "${PLUGIN_DIR}/tool.py"]}
    (kit / "plugin.json").write_text(json.dumps({"id": "kit", "tools": [tool]}))
    profile = mode_profile("rw", backend=backend.name)
    async with Sandbox.open(
        workspace, profile=profile, plugins=[kit / "plugin.json"], granted_plugins=["kit"], mode="auto"
    ) as box:
        result = await box.call("plugin_kit_hi", {})
        assert result.ok and "hi" in result.content, result
        await assert_never_ran(box, workspace, marker)
