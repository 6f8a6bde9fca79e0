"""Confinement on real Windows: the restricted token at low integrity and the jail's ACL grants,
attacked (sandbox/backends/winjob_token.py).

Wine runs every call of it and enforces none: the attacks are marked Windows-only (they run in
the windows-latest workflow) and skipped under Wine with that reason. Under Wine one test runs
the token's code path end to end (``SANDBOX_WINJOB_TOKEN_UNDER_WINE=1``) to show the plumbing
works (structures, CreateProcessAsUserW, grants taken back); it claims nothing about enforcement.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from sandbox import exec as executor
from sandbox.backends import base, winjob, winjob_job

if TYPE_CHECKING:
    from sandbox.profile import Profile

pytestmark = pytest.mark.anyio
UNDER_WINE = winjob_job.wine_version() is not None
windows_only = pytest.mark.skipif(
    UNDER_WINE,
    reason=f"needs real Windows: Wine {winjob_job.wine_version()} accepts restricted tokens, integrity levels and "
    "file ACLs but enforces none of them",
)
CMD = os.environ.get("COMSPEC", "cmd.exe")


def acl(path: Path) -> str:
    return subprocess.run(["icacls", str(path)], capture_output=True, text=True, check=False).stdout


async def test_the_token_path_runs_under_wine(
    workspace: Path, profile: Profile, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Plumbing only: the jail made with the token path starts commands, streams and exits as usual."""
    monkeypatch.setenv(winjob.TOKEN_UNDER_WINE, "1")
    async with await base.get("winjob").open_jail(workspace, profile) as jail:
        assert isinstance(jail, winjob.WinJobJail) and jail.confinement is not None
        assert jail.confinement.token and jail.confinement.jail_sid.startswith("S-1-9-")
        result = await executor.run(jail, [CMD, "/d", "/c", "echo out& echo err 1>&2& exit /b 5"])
        assert (result.exit_code, result.stdout.strip(), result.stderr.strip()) == (5, "out", "err")
        granted = [path for path, _label in jail.confinement.grants.done]
        assert str(workspace) in granted and str(jail.private) in granted
    assert jail.confinement.grants.done == [] and jail.confinement.token == 0


@windows_only
async def test_writes_outside_the_grants_are_refused(workspace: Path, profile: Profile) -> None:
    outside = Path(os.environ["USERPROFILE"]) / f"sbx-escape-{uuid.uuid4().hex[:8]}.txt"
    async with await base.get("winjob").open_jail(workspace, profile) as jail:
        inside = await executor.run(jail, [CMD, "/d", "/c", "echo ok>inside.txt"])
        temp = await executor.run(jail, [CMD, "/d", "/c", "echo ok>%TEMP%\\t.txt"])
        escape = await executor.run(jail, [CMD, "/d", "/c", f"echo pwned>{outside}"])
        system = await executor.run(jail, [CMD, "/d", "/c", "echo pwned>%SystemRoot%\\Temp\\sbx-escape.txt"])
    assert inside.exit_code == 0 and (workspace / "inside.txt").exists()
    assert temp.exit_code == 0
    assert escape.exit_code != 0 and not outside.exists()
    assert system.exit_code != 0


@windows_only
async def test_the_token_is_low_integrity_without_admin(workspace: Path, profile: Profile) -> None:
    async with await base.get("winjob").open_jail(workspace, profile) as jail:
        result = await executor.run(jail, ["whoami", "/groups"])
        privileges = await executor.run(jail, ["whoami", "/priv"])
    assert "S-1-16-4096" in result.stdout  # Mandatory Label\Low Mandatory Level
    for line in result.stdout.splitlines():
        if "S-1-5-32-544" in line:  # Administrators, when the caller is one
            assert "deny only" in line.lower(), line
    names = [line.split()[0] for line in privileges.stdout.splitlines() if line.startswith("Se")]
    assert names == ["SeChangeNotifyPrivilege"], names


@windows_only
async def test_grants_are_taken_back_on_close(workspace: Path, profile: Profile) -> None:
    async with await base.get("winjob").open_jail(workspace, profile) as jail:
        assert isinstance(jail, winjob.WinJobJail) and jail.confinement is not None
        sid = jail.confinement.jail_sid
        assert sid in acl(workspace)
    assert sid not in acl(workspace)


@windows_only
async def test_copy_keeps_the_host_workspace_unwritable(workspace: Path, profile: Profile) -> None:
    (workspace / "a.txt").write_text("host\n")
    copied = profile.with_overrides(**{"mount.strategy": "copy"})
    async with await base.get("winjob").open_jail(workspace, copied) as jail:
        result = await executor.run(jail, [CMD, "/d", "/c", f"echo pwned>{workspace}\\a.txt"])
    assert result.exit_code != 0 and (workspace / "a.txt").read_text() == "host\n"
