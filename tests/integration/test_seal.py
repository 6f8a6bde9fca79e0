"""Secrets and git internals sealed at the OS level (sandbox/backends/seal.py), tested by attack:
a command cannot read a masked secret by any path, nor replace, unlink or link it, nor plant a git
hook or rewrite ``.git/config`` in ``rw`` mode, nor rename ``.git`` away; a ``copy`` session never
copies a secret nor reports it as a change; ordinary work (git commits, other files) goes on."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest

from sandbox import exec as executor
from sandbox.backends import base, seal
from tests.conftest import backend_or_skip, make_profile, own_like_a_checkout

pytestmark = [pytest.mark.anyio]
SANDBOX = str(Path(sys.executable).with_name("sandbox"))


@pytest.fixture
def project(workspace: Path, request: pytest.FixtureRequest) -> Path:
    (workspace / ".env").write_text("API_KEY=hunter2\n")
    (workspace / ".env.example").write_text("API_KEY=\n")
    (workspace / "deploy").mkdir()
    (workspace / "deploy" / "server.key").write_text("PRIVATE\n")
    (workspace / "vault").mkdir()
    (workspace / "vault" / "token").write_text("TOKEN\n")
    (workspace / "node_modules" / "pkg").mkdir(parents=True)
    (workspace / "node_modules" / "pkg" / "ca.pem").write_text("public cert\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "safe.directory=*", "-C", str(workspace)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "README.md"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "one"], check=True)
    if "backend" in request.fixturenames and request.getfixturevalue("backend").name == "docker":
        own_like_a_checkout(workspace)  # Docker runs commands as the workspace's owner, never root
    return workspace


@pytest.fixture(
    params=[pytest.param("bwrap", marks=pytest.mark.bwrap), pytest.param("docker", marks=pytest.mark.docker)]
)
def backend(request: pytest.FixtureRequest) -> base.Backend:
    return backend_or_skip(request.param)


async def run(backend: base.Backend, workspace: Path, script: str, **overrides: object) -> executor.ExecResult:
    profile = make_profile("default", **{"policy.deny_read": ("vault/**",), **overrides})
    async with await backend.open_jail(workspace, profile) as jail:
        return await executor.run(jail, ["bash", "-c", script])


def test_find_masks_matching_entries_and_skips_dependency_trees(project: Path) -> None:  # no jail
    found = seal.find(project, ("vault/**",))
    assert found.masked == ((".env", False), ("deploy/server.key", False), ("vault", True))
    assert found.git


async def test_a_secret_reads_as_nothing_by_any_path(backend: base.Backend, project: Path) -> None:
    result = await run(
        backend,
        project,
        'cat .env; cat ./.env deploy/../.env "$PWD/.env" deploy/server.key; ls vault; cat vault/token; '
        "ln -s .env link; cat link; cat .env.example; echo end",
    )
    assert "hunter2" not in result.stdout and "PRIVATE" not in result.stdout and "TOKEN" not in result.stdout
    assert result.stdout.endswith("API_KEY=\nend\n"), result.stdout  # the exception (.env.example) stays readable


async def test_a_secret_cannot_be_replaced_unlinked_or_linked(backend: base.Backend, project: Path) -> None:
    result = await run(
        backend,
        project,
        "echo x > .env; echo w=$?; rm -f .env; echo rm=$?; echo new > other; mv other .env; echo mv=$?; "
        "ln .env hard; echo ln=$?; mv deploy deploy2 && cat deploy2/server.key; echo mvdir=$?; "
        "rm -rf vault; echo rmdir=$?",
    )
    codes = dict(line.split("=") for line in result.stdout.split() if "=" in line and line.split("=")[0].isalpha())
    assert codes["w"] != "0" and codes["rm"] != "0" and codes["mv"] != "0" and codes["ln"] != "0"
    assert codes["rmdir"] != "0"
    assert "PRIVATE" not in result.stdout
    assert (project / ".env").read_text() == "API_KEY=hunter2\n"
    assert (project / "vault" / "token").read_text() == "TOKEN\n"
    assert "EXDEV" in result.stderr or "cross-device" in result.stderr


async def test_rw_git_hooks_and_config_are_read_only_but_commits_work(backend: base.Backend, project: Path) -> None:
    result = await run(
        backend,
        project,
        "echo '#!/bin/sh' > .git/hooks/pre-commit; echo hook=$?; echo '[core]' >> .git/config; echo cfg=$?; "
        "mv .git .git-old; echo mvgit=$?; rm -rf .git/hooks; echo rmhooks=$?; "
        "echo change >> README.md && git add README.md && "
        "git -c user.name=t -c user.email=t@t commit -q -m two && echo committed",
    )
    for name in ("hook", "cfg", "mvgit", "rmhooks"):
        assert f"{name}=0" not in result.stdout, result.stdout
    assert "committed" in result.stdout, result.stderr
    assert not (project / ".git" / "hooks" / "pre-commit").exists()
    assert "[core]\n[core]" not in (project / ".git" / "config").read_text()
    log = await anyio.run_process(["git", "-c", "safe.directory=*", "-C", str(project), "log", "--oneline"])
    assert len(log.stdout.splitlines()) == 2


async def test_rw_a_missing_hooks_directory_is_made_and_sealed(backend: base.Backend, project: Path) -> None:
    hooks = project / ".git" / "hooks"
    shutil.rmtree(hooks)
    result = await run(backend, project, "mkdir -p .git/hooks; echo evil > .git/hooks/post-checkout; echo rc=$?")
    assert "rc=0" not in result.stdout
    assert hooks.is_dir() and list(hooks.iterdir()) == []


async def test_copy_never_copies_a_secret_nor_reports_it(backend: base.Backend, project: Path) -> None:
    profile = make_profile("untrusted", **{"policy.deny_read": ("vault/**",)})
    async with await backend.open_jail(project, profile) as jail:
        result = await executor.run(jail, ["bash", "-c", "cat .env; ls vault; echo x > .env; echo hi > new.txt"])
        assert "hunter2" not in result.stdout and "token" not in result.stdout
        changes = await jail.changes()
        assert changes is not None
        paths = {c.path for c in changes.changes}
        assert paths == {"new.txt"}
        await jail.apply(changes)
    assert (project / ".env").read_text() == "API_KEY=hunter2\n" and (project / "new.txt").read_text() == "hi\n"


@pytest.mark.bwrap
def test_sandbox_run_seals_on_the_quick_path_too(project: Path) -> None:
    backend_or_skip("bwrap")
    for _ in range(2):  # the second run takes the quick path
        done = subprocess.run(
            [SANDBOX, "run", "--workspace", str(project), "--", "cat", ".env", "deploy/server.key"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0 and done.stdout == "", (done.stdout, done.stderr)


@pytest.mark.bwrap
def test_sandbox_run_masks_a_secret_created_after_a_cached_search(project: Path, data_dir: Path) -> None:
    """Each ``sandbox run`` is a process of its own: the second reads the first's search from the
    data directory (sandbox/backends/seal.py's cache) and must still mask what came after it."""
    backend_or_skip("bwrap")
    time.sleep(seal.RACY_NS / 1e9 + 0.2)  # past the racy window: the first run's search is trusted

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [SANDBOX, "run", "--workspace", str(project), "--", *argv], capture_output=True, text=True, check=False
        )

    assert run("true").returncode == 0
    assert list((data_dir / "cache" / "seal").iterdir()), "the first run kept no search"
    (project / "deploy" / "late.pem").write_text("LATE\n")  # an existing directory, deep or not
    (project / "src" / "new").mkdir()
    (project / "src" / "new" / ".env.prod").write_text("PROD\n")
    done = run("cat", "deploy/late.pem", "src/new/.env.prod", ".env")
    assert done.returncode == 0 and done.stdout == "", (done.stdout, done.stderr)
    (project / "deploy" / "late.pem").unlink()
    done = run("ls", "deploy")
    assert done.stdout.split() == ["server.key"], (done.stdout, done.stderr)
