"""Kept changesets through the installed console script: ``sandbox run --mount copy``, then
``sandbox changes list/show/apply/discard``, under real bubblewrap and (marked) Docker."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import backend_or_skip, own_like_a_checkout

SANDBOX = str(Path(sys.executable).with_name("sandbox"))
KEPT = re.compile(r"changes kept as (ch-[0-9a-f]{12})")
HOOK = ".git/hooks/pre-commit"
MAKE_HOOK = (
    "mkdir -p .git/hooks && printf '#!/bin/sh\\nexit 0\\n' > .git/hooks/pre-commit && chmod +x .git/hooks/pre-commit"
)


@pytest.fixture(
    params=[pytest.param("bwrap", marks=pytest.mark.bwrap), pytest.param("docker", marks=pytest.mark.docker)]
)
def cli_backend(request: pytest.FixtureRequest, workspace: Path) -> str:
    name: str = request.param
    backend_or_skip(name)
    if name == "docker":
        own_like_a_checkout(workspace)
    return name


def sandbox(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SANDBOX, *args],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=120,
        env=os.environ.copy(),
        check=False,
    )


def run_copy(backend: str, workspace: Path, script: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return sandbox(
        "run", "--backend", backend, "--mount", "copy", "--workspace", str(workspace), *extra, "--", "sh", "-c", script
    )


def kept_id(done: subprocess.CompletedProcess[str]) -> str:
    found = KEPT.search(done.stderr)
    assert found, done.stderr
    return found[1]


def test_a_copy_run_keeps_its_changes_under_an_id(cli_backend: str, workspace: Path) -> None:
    done = run_copy(cli_backend, workspace, "echo new > added.txt; echo changed > README.md")
    assert done.returncode == 0, done.stderr
    changeset = kept_id(done)
    assert f"sandbox changes show {changeset}" in done.stderr
    assert f"sandbox changes apply {changeset}" in done.stderr
    assert not (workspace / "added.txt").exists()

    listed = json.loads(sandbox("changes", "list", "--workspace", str(workspace), "--json").stdout)
    assert [c["id"] for c in listed["changesets"]] == [changeset]

    shown = sandbox("changes", "show", changeset)
    assert shown.returncode == 0, shown.stderr
    assert "+changed" in shown.stdout and "-# sample" in shown.stdout and "+new" in shown.stdout

    applied = sandbox("changes", "apply", changeset, "--json")
    assert applied.returncode == 0, applied.stderr
    assert sorted(json.loads(applied.stdout)["applied"]) == ["README.md", "added.txt"]
    assert (workspace / "README.md").read_text() == "changed\n"
    assert (workspace / "added.txt").read_text() == "new\n"


def test_run_json_carries_the_changeset_id(cli_backend: str, workspace: Path) -> None:
    done = run_copy(cli_backend, workspace, "echo x > new.txt", "--json")
    out = json.loads(done.stdout)
    assert re.fullmatch(r"ch-[0-9a-f]{12}", out["changeset_id"])
    shown = json.loads(sandbox("changes", "show", out["changeset_id"], "--json").stdout)
    assert [c["path"] for c in shown["changes"]] == ["new.txt"]
    assert "+x" in shown["diff"]


def test_a_run_without_changes_keeps_nothing(cli_backend: str, workspace: Path) -> None:
    done = run_copy(cli_backend, workspace, "true", "--json")
    assert json.loads(done.stdout)["changeset_id"] is None
    assert json.loads(sandbox("changes", "list", "--json").stdout)["changesets"] == []


def test_run_apply_holds_a_git_hook_back(cli_backend: str, workspace: Path) -> None:
    done = run_copy(cli_backend, workspace, f"{MAKE_HOOK}; echo ok > plain.txt", "--apply", "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert (workspace / "plain.txt").read_text() == "ok\n"
    assert not (workspace / HOOK).exists()
    held = {h["path"]: h["flags"] for h in out["applied"]["held_back"]}
    assert set(held) == {".git", ".git/hooks", HOOK}  # the new directories are dotfiles: flagged too
    assert "git-hook" in held[HOOK]

    named = sandbox("changes", "apply", out["changeset_id"], "--only", HOOK)
    assert named.returncode == 0, named.stderr
    assert (workspace / HOOK).stat().st_mode & 0o111


def test_run_apply_says_what_it_held_back(cli_backend: str, workspace: Path) -> None:
    done = run_copy(cli_backend, workspace, MAKE_HOOK, "--apply")
    assert done.returncode == 0
    assert f"held back {HOOK}" in done.stderr and "--include-flagged" in done.stderr
    assert not (workspace / HOOK).exists()


def test_changes_apply_exits_1_when_something_is_held_back(cli_backend: str, workspace: Path) -> None:
    changeset = kept_id(run_copy(cli_backend, workspace, f"{MAKE_HOOK}; echo ok > plain.txt"))
    partial = sandbox("changes", "apply", changeset)
    assert partial.returncode == 1
    assert HOOK in partial.stdout + partial.stderr
    assert (workspace / "plain.txt").exists() and not (workspace / HOOK).exists()
    rest = sandbox("changes", "apply", changeset, "--include-flagged")
    assert rest.returncode == 0, rest.stderr
    assert (workspace / HOOK).exists()


@pytest.mark.bwrap
def test_a_host_change_since_copy_in_is_a_conflict(workspace: Path) -> None:
    backend_or_skip("bwrap")
    changeset = kept_id(run_copy("bwrap", workspace, "echo jail > README.md"))
    (workspace / "README.md").write_text("host\n")
    done = sandbox("changes", "apply", changeset)
    assert done.returncode == 1
    assert "CONFLICT" in done.stdout + done.stderr
    assert (workspace / "README.md").read_text() == "host\n"


@pytest.mark.bwrap
def test_unknown_ids_and_discard(workspace: Path) -> None:
    backend_or_skip("bwrap")
    for args in (["show", "ch-000000000000"], ["apply", "nonsense"], ["discard", "ch-000000000000"]):
        done = sandbox("changes", *args)
        assert done.returncode == 2
        assert done.stderr.startswith("sandbox: ") and len(done.stderr.strip().splitlines()) == 1
    changeset = kept_id(run_copy("bwrap", workspace, "echo x > new.txt"))
    assert sandbox("changes", "discard", changeset).returncode == 0
    assert sandbox("changes", "show", changeset).returncode == 2


@pytest.mark.bwrap
@pytest.mark.root
def test_an_overlay_run_keeps_its_changes_too(workspace: Path) -> None:
    from sandbox.mounts import overlay_support

    backend_or_skip("bwrap")
    if reason := overlay_support():
        pytest.skip(f"no overlay here: {reason}")
    done = sandbox(
        "run",
        "--mount",
        "overlay",
        "--workspace",
        str(workspace),
        "--",
        "sh",
        "-c",
        "echo o > README.md; rm src/app.py",
    )
    changeset = kept_id(done)
    assert (workspace / "src" / "app.py").exists()
    applied = sandbox("changes", "apply", changeset, "--json")
    assert applied.returncode == 0, applied.stderr
    assert sorted(json.loads(applied.stdout)["applied"]) == ["README.md", "src/app.py"]
    assert (workspace / "README.md").read_text() == "o\n" and not (workspace / "src" / "app.py").exists()


@pytest.mark.bwrap
def test_run_apply_marks_the_kept_changeset_applied(workspace: Path) -> None:
    backend_or_skip("bwrap")
    done = run_copy("bwrap", workspace, "echo x > new.txt", "--apply")
    changeset = kept_id(done)
    assert "(applied)" in done.stderr and (workspace / "new.txt").exists()
    [listed] = json.loads(sandbox("changes", "list", "--json").stdout)["changesets"]
    assert (listed["id"], listed["state"]) == (changeset, "applied")


@pytest.mark.bwrap
@pytest.mark.parametrize(("crash_after", "action"), [("12", "rolled-back"), ("45", "rolled-forward")])
def test_an_apply_killed_midway_is_recovered_whole(workspace: Path, crash_after: str, action: str) -> None:
    """``sandbox changes apply`` SIGKILLed after a few durable steps (the journal's test hook);
    ``sandbox changes recover`` then leaves the workspace entirely old or entirely new."""
    backend_or_skip("bwrap")
    names = [f"f{i:02d}.txt" for i in range(30)]
    done = run_copy("bwrap", workspace, "; ".join(f"echo new > {name}" for name in names))
    changeset = kept_id(done)
    env = dict(os.environ, SANDBOX_JOURNAL_CRASH_AFTER=crash_after)
    killed = subprocess.run(
        [SANDBOX, "changes", "apply", changeset], capture_output=True, text=True, env=env, timeout=120, check=False
    )
    assert killed.returncode == -9, killed
    present = [name for name in names if (workspace / name).exists()]
    assert len(present) < len(names), "the kill came after the apply had finished: no test"

    recovered = sandbox("changes", "recover", "--json")
    assert recovered.returncode == 0, recovered.stderr
    [report] = json.loads(recovered.stdout)["recovered"]
    assert report["action"] == action
    present = [name for name in names if (workspace / name).exists()]
    assert present == ([] if action == "rolled-back" else names), present
    strays = [p.name for p in workspace.iterdir() if p.name.startswith(".") and p.name not in (".git",)]
    assert strays == []
    assert json.loads(sandbox("changes", "recover", "--json").stdout)["recovered"] == []
