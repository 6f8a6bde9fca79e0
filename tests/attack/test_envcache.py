"""Environment directories and their cache, attacked on every backend (issue 32, item 3).

A run writes into an environment directory (``.venv``) of its private copy. Without the profile's
consent to a cross-session cache, the next run never sees it; with it, the next run sees it only
while the lock files are the ones it was saved under, and only after a run whose command
succeeded. Whatever the cache holds, it reaches the host only as an added environment directory,
held back from ``apply`` until it is named (``--only .venv``) or included explicitly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from sandbox import changes
from sandbox import exec as executor
from sandbox.cli import run as cli_run
from sandbox.mounts import envdirs
from tests.attack.conftest import mode_profile
from tests.conftest import own_like_a_checkout

if TYPE_CHECKING:
    from pathlib import Path

    from sandbox import profile as profiles
    from sandbox.backends import base
    from tests.conftest import JailFactory

pytestmark = pytest.mark.anyio
ENV = (".venv", "node_modules")
PLANT = "mkdir -p .venv/bin && printf '#!/bin/sh\\necho planted\\n' > .venv/bin/pytest && chmod +x .venv/bin/pytest"
LOOK = "cat .venv/bin/pytest 2>/dev/null || echo none"


def _profile(cache: str) -> profiles.Profile:
    return mode_profile("copy", **{"mount.environment": ENV, "mount.environment_cache": cache})


async def _run_once(open_jail: JailFactory, prof: profiles.Profile, script: str) -> tuple[str, int]:
    """One run as ``sandbox run`` makes it: the command, then the cache hook, then the jail's close."""
    jail = await open_jail(prof)
    try:
        result = await executor.run(jail, ["sh", "-c", script])
        await cli_run._cache_environment(jail, prof, result)
    finally:
        await jail.aclose()
    return result.stdout.strip(), result.exit_code


def _lock(workspace: Path, text: str) -> None:
    (workspace / "requirements.txt").write_text(text)
    own_like_a_checkout(workspace)


async def test_without_the_cache_a_later_run_never_sees_an_environment_dir(
    open_jail: JailFactory, workspace: Path, data_dir: Path
) -> None:
    _lock(workspace, "pytest==8.0\n")
    assert (await _run_once(open_jail, _profile("off"), PLANT))[1] == 0
    seen, _ = await _run_once(open_jail, _profile("off"), LOOK)
    assert seen == "none"
    assert not (data_dir / "envcache").exists() or not any((data_dir / "envcache").iterdir())
    assert not (workspace / ".venv").exists()


async def test_with_the_cache_only_the_same_lock_files_see_it(
    open_jail: JailFactory, workspace: Path, backend: base.Backend
) -> None:
    _lock(workspace, "pytest==8.0\n")
    assert (await _run_once(open_jail, _profile("project"), PLANT))[1] == 0
    seen, _ = await _run_once(open_jail, _profile("project"), LOOK)
    assert "planted" in seen, f"{backend.name}: the cached .venv was not seeded"
    assert not (workspace / ".venv").exists()  # seeded into the private copy, never the host
    _lock(workspace, "pytest==8.1\n")  # another dependency set: a fresh environment
    seen, _ = await _run_once(open_jail, _profile("project"), LOOK)
    assert seen == "none"


async def test_a_failed_run_does_not_fill_the_cache(open_jail: JailFactory, workspace: Path) -> None:
    _lock(workspace, "pytest==8.0\n")
    assert (await _run_once(open_jail, _profile("project"), f"{PLANT}; exit 3"))[1] == 3
    seen, _ = await _run_once(open_jail, _profile("project"), LOOK)
    assert seen == "none"


async def test_no_lock_file_no_cache(open_jail: JailFactory) -> None:
    assert (await _run_once(open_jail, _profile("project"), PLANT))[1] == 0
    seen, _ = await _run_once(open_jail, _profile("project"), LOOK)
    assert seen == "none"


async def test_an_environment_dir_reaches_the_host_only_with_consent(
    open_jail: JailFactory, workspace: Path, private_mode: str
) -> None:
    prof = mode_profile(private_mode, **{"mount.environment": ENV})
    jail = await open_jail(prof)
    try:
        result = await executor.run(jail, ["sh", "-c", f"{PLANT} && echo work > src/new.py"])
        assert result.exit_code == 0, result.stderr
        changeset = await jail.changes()
        assert changeset is not None
        kept = await _keep(jail, changeset, prof)
    finally:
        await jail.aclose()
    report = await kept.apply(include_flagged=True)  # consent to flagged entries is not consent to .venv
    assert (workspace / "src" / "new.py").read_text() == "work\n"
    assert not (workspace / ".venv").exists()
    [held] = [h for h in report.held_back if h.get("group") == envdirs.GROUP]
    assert held["path"] == ".venv"
    assert "--only .venv" in held["summary"]
    report = await changes.load(kept.id).apply([".venv"])
    assert (workspace / ".venv" / "bin" / "pytest").read_text() == "#!/bin/sh\necho planted\n"
    assert ".venv/bin/pytest" in report.applied


async def _keep(jail: base.Jail, changeset: Any, prof: profiles.Profile) -> changes.Kept:
    """Keep ``changeset`` as ``sandbox run`` does, with the profile's environment directories."""
    assert jail.tree is not None
    return await changes.keep(
        jail.tree, changeset, source="run", profile="test", backend=jail.backend, environment=prof.mount.environment
    )


async def test_a_seeded_dir_is_added_and_held_back(open_jail: JailFactory, workspace: Path) -> None:
    _lock(workspace, "pytest==8.0\n")
    prof = _profile("project")
    assert (await _run_once(open_jail, prof, PLANT))[1] == 0
    jail = await open_jail(prof)
    try:
        result = await executor.run(jail, ["sh", "-c", "echo work > src/new.py"])
        assert result.exit_code == 0, result.stderr
        changeset = await jail.changes()
        assert changeset is not None
        added = {c.path for c in changeset.changes if c.status == "added"}
        assert ".venv/bin/pytest" in added  # the host has no .venv: what the cache gave is shown
        kept = await _keep(jail, changeset, prof)
    finally:
        await jail.aclose()
    await kept.apply(include_flagged=True)
    assert (workspace / "src" / "new.py").exists()
    assert not (workspace / ".venv").exists()
