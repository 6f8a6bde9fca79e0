"""The host backend: no isolation, only by name, but a scrubbed environment and a real tree kill."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from sandbox import exec as executor
from sandbox import profile as profiles
from sandbox.backends import AUTO_ORDER, base, cgroups
from sandbox.errors import GuaranteeUnavailable
from tests.conftest import survivors

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.anyio


def trusted(**overrides: object) -> profiles.Profile:
    return profiles.load("trusted").with_overrides(**overrides)


async def test_auto_never_picks_host() -> None:
    assert "host" not in AUTO_ORDER
    assert base.choose("auto", trusted(backend="auto")).name != "host"


async def test_host_refuses_isolating_profiles(workspace: Path) -> None:
    with pytest.raises(GuaranteeUnavailable):
        await base.get("host").open_jail(workspace, profiles.load("default"))


async def test_runs_in_place_with_scrubbed_env(workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("API_TOKEN", "tok_secret_value")
    async with await base.get("host").open_jail(workspace, trusted()) as jail:
        result = await executor.run(jail, ["/bin/sh", "-c", "pwd; env; echo hi > made.txt"])
    assert result.stdout.splitlines()[0] == str(workspace)
    assert "tok_secret_value" not in result.stdout and (workspace / "made.txt").exists()


async def test_tree_kill_catches_double_forks_through_the_cgroup(workspace: Path, marker: str) -> None:
    if not isinstance(cgroups.hierarchies()["pids"], cgroups.Hierarchy):
        pytest.skip("no writable pids cgroup here: the host backend cannot track double forks")
    async with await base.get("host").open_jail(workspace, trusted()) as jail:
        result = await executor.run(
            jail,
            [
                "/bin/sh",
                "-c",
                f"trap '' TERM; ( (setsid sleep {marker} &) & ); nohup sleep {marker} >/dev/null 2>&1 & sleep {marker}",
            ],
            timeout=1,
        )
        assert result.timed_out
        assert survivors(marker) == []
        normal = await executor.run(jail, ["/bin/sh", "-c", f"(setsid sleep {marker} &); echo done"])
        assert normal.stdout == "done\n" and survivors(marker) == []
