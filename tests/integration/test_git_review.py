"""Git-aware review through the console script: ``git commit`` in a ``copy`` run under real
bubblewrap (and, marked, Docker), summarised on stderr, in ``--json`` and by ``changes show``, and
brought back whole by ``changes apply``; and the attack: a jail that plants commands for git to run
(fsmonitor, pager, a filter, a hook) must never get one run by the review or the apply."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from typing import TYPE_CHECKING

import pytest

from tests.conftest import backend_or_skip, own_like_a_checkout
from tests.integration.test_changes_cli import kept_id, run_copy, sandbox

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
IDENTITY = "-c user.name=Ann -c user.email=ann@x"
ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "PATH": os.environ["PATH"]}


def git(repo: Path, *args: str) -> str:
    # safe.directory: a Docker test hands the repository to uid 1000; this is our own fixture.
    argv = ["git", "-c", "safe.directory=*", "-C", str(repo), *args]
    return subprocess.run(argv, capture_output=True, text=True, env=ENV, check=True).stdout.strip()


@pytest.fixture
def repo(workspace: Path) -> Path:
    git(workspace, "init", "-q", "-b", "main")
    git(workspace, "add", "-A")
    git(workspace, "-c", "user.name=Ann", "-c", "user.email=ann@x", "commit", "-q", "-m", "first")
    return workspace


@pytest.fixture
def cli_backend(request: pytest.FixtureRequest, repo: Path) -> str:
    name: str = request.param
    backend_or_skip(name)
    if name == "docker":
        own_like_a_checkout(repo)  # .git included
    return name


def commit_script(message: str) -> str:
    return f"echo changed > README.md && git {IDENTITY} commit -q -am '{message}'"


BACKENDS = [pytest.param("bwrap", marks=pytest.mark.bwrap), pytest.param("docker", marks=pytest.mark.docker)]


@pytest.mark.parametrize("cli_backend", BACKENDS, indirect=True)
def test_a_commit_is_summarised_and_applied_whole(cli_backend: str, repo: Path) -> None:
    done = run_copy(cli_backend, repo, commit_script("fix parser"))
    assert done.returncode == 0, done.stderr
    assert "1 new commit on main: " in done.stderr and '"fix parser" (Ann <ann@x>)' in done.stderr
    assert "git: index changed" in done.stderr
    assert ".git/objects/" not in done.stderr and "M README.md" in done.stderr
    changeset = kept_id(done)

    shown = sandbox("changes", "show", changeset)
    assert shown.returncode == 0, shown.stderr
    assert "git: 1 new commit on main: " in shown.stdout and "+changed" in shown.stdout
    assert ".git/objects/" not in shown.stdout
    as_json = json.loads(sandbox("changes", "show", changeset, "--json").stdout)
    assert as_json["git"]["refs"][0]["commits"][0]["subject"] == "fix parser"

    applied = sandbox("changes", "apply", changeset, "--json")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert git(repo, "log", "-1", "--format=%s (%an)") == "fix parser (Ann)"
    git(repo, "fsck", "--strict")
    assert git(repo, "status", "--porcelain") == ""


@pytest.mark.bwrap
@pytest.mark.parametrize("cli_backend", ["bwrap"], indirect=True)
def test_run_json_carries_the_git_summary(cli_backend: str, repo: Path) -> None:
    done = run_copy(cli_backend, repo, commit_script("in json"), "--json")
    out = json.loads(done.stdout)
    (main,) = out["git"]["refs"]
    assert (main["ref"], main["change"]) == ("refs/heads/main", "moved")
    assert [c["subject"] for c in main["commits"]] == ["in json"]
    assert out["git"]["risky"] == []


def plant(marker: Path, evil: Path) -> str:
    """A commit, then commands planted for git to run, each of which would create ``marker``."""
    evil.write_text(f'#!/bin/sh\necho ran "$0" >> {marker}\ncat\n')
    evil.chmod(0o755)
    config = f'[core]\n\tfsmonitor = {evil}\n\tpager = {evil}\n[filter "x"]\n\tclean = {evil}\n\tsmudge = {evil}\n'
    return (
        f"{commit_script('innocent')} && printf '{config}' >> .git/config"
        f" && printf '#!/bin/sh\\n{evil}\\n' > .git/hooks/post-checkout && chmod +x .git/hooks/post-checkout"
        " && echo '* filter=x' > .gitattributes && echo plain > plain.txt"
    )


@pytest.mark.bwrap
@pytest.mark.parametrize("cli_backend", ["bwrap"], indirect=True)
def test_planted_commands_are_flagged_and_never_run(cli_backend: str, repo: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"  # not in the workspace: the jail cannot write there, only we could
    outside.mkdir()
    marker, evil = outside / "marker", outside / "evil.sh"
    done = run_copy(cli_backend, repo, plant(marker, evil))
    assert done.returncode == 0, done.stderr
    for key in ("core.fsmonitor", "core.pager", "filter.x.clean", "filter.x.smudge"):
        assert f"git: RISKY {key} = {evil} (added)" in done.stderr
    assert "git: RISKY hook .git/hooks/post-checkout (added)" in done.stderr
    changeset = kept_id(done)

    shown = sandbox("changes", "show", changeset)
    assert "git: RISKY core.fsmonitor" in shown.stdout and "risky, held back" in shown.stdout
    applied = sandbox("changes", "apply", changeset, "--json")
    assert applied.returncode == 1
    report = json.loads(applied.stdout)
    assert "plain.txt" in report["applied"]
    (group,) = [h for h in report["held_back"] if h.get("group") == "git"]
    assert group["path"] == ".git" and "git-hook" in group["flags"]
    assert not any(p.startswith(".git") for p in report["applied"])
    assert {h["path"] for h in report["held_back"]} == {".git", ".gitattributes"}
    assert (repo / "plain.txt").read_text() == "plain\n"
    assert not marker.exists()
    assert "fsmonitor" not in (repo / ".git" / "config").read_text()
    assert git(repo, "log", "--format=%s") == "first"
