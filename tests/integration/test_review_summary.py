"""A changeset a person can read, through the installed ``sandbox`` command on real bubblewrap:
a run that installs 500 packages prints at most 20 lines on stderr, ``changes show`` gives a
summary, ``--stat`` and path filters, and ``changes prune`` / ``discard --all`` empty the store."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING

import pytest

from tests.conftest import backend_or_skip
from tests.integration._cli import sandbox, shell

if TYPE_CHECKING:
    import subprocess
    from pathlib import Path

pytestmark = pytest.mark.bwrap
MAX_LINES = 20  # the bound on a run's stderr about its changeset, whatever its size
KEPT = re.compile(r"changes kept as (ch-[0-9a-f]{12})")
HOOK = ".git/hooks/pre-commit"
# 250 npm-like packages and 250 Python ones, two files each, a source edit, a planted hook.
INSTALL = (
    "for i in $(seq 1 250); do mkdir -p node_modules/p$i .venv/lib/site-packages/q$i; "
    'echo "module.exports = $i" > node_modules/p$i/index.js; echo "{}" > node_modules/p$i/package.json; '
    "echo x > .venv/lib/site-packages/q$i/m.py; echo y > .venv/lib/site-packages/q$i/n.py; done; "
    "echo 'print(1)' > src/app.py; mkdir -p .git/hooks; printf '#!/bin/sh\\n' > " + HOOK + "; chmod +x " + HOOK
)
NEW_TOOL = "mkdir tools && printf '#!/bin/sh\\n' > tools/run && chmod +x tools/run"
ENVIRONMENT_PROFILE = """\
description = "a copy run with environment directories"
[mount]
strategy = "copy"
environment = [".venv", "node_modules"]
"""


@pytest.fixture(autouse=True)
def _bwrap() -> None:
    backend_or_skip("bwrap")


def run_copy(workspace: Path, script: str, *extra: str) -> subprocess.CompletedProcess[str]:
    done: subprocess.CompletedProcess[str] = sandbox(
        "run", "--backend", "bwrap", "--mount", "copy", *extra, *shell(workspace, script), text=True
    )
    assert done.returncode == 0, done.stderr
    return done


def kept_id(done: subprocess.CompletedProcess[str]) -> str:
    found = KEPT.search(done.stderr)
    assert found, done.stderr
    return found[1]


def show(*args: str) -> subprocess.CompletedProcess[str]:
    done: subprocess.CompletedProcess[str] = sandbox("changes", "show", *args, text=True)
    return done


def test_an_install_of_500_packages_prints_at_most_20_lines(workspace: Path) -> None:
    done = run_copy(workspace, INSTALL)
    lines = done.stderr.splitlines()
    assert len(lines) <= MAX_LINES, done.stderr
    assert lines[0].startswith("sandbox: 1,508 changes (1,507 added, 1 modified), ")
    assert f"A {HOOK}  [git-hook, new-executable]" in done.stderr  # flagged: named, whatever the size
    assert "M src/app.py" in done.stderr
    assert re.search(r"node_modules/: 751 changes", done.stderr), done.stderr
    assert "more flagged: sandbox changes show ch-" in done.stderr  # the .venv dotfiles: counted, not listed


def test_environment_directories_are_one_line_each(workspace: Path, tmp_path: Path) -> None:
    profile = tmp_path / "env.toml"
    profile.write_text(ENVIRONMENT_PROFILE)
    done = run_copy(workspace, INSTALL, "--profile", str(profile), "--apply")
    assert len(done.stderr.splitlines()) <= MAX_LINES, done.stderr
    assert "node_modules: 250 packages, 500 files" in done.stderr
    assert ".venv: " in done.stderr and "--only .venv or --include-environment" in done.stderr
    assert "held back the environment (.venv, node_modules)" in done.stderr
    assert (workspace / "src" / "app.py").read_text() == "print(1)\n"  # the work was applied
    assert not (workspace / "node_modules").exists() and not (workspace / HOOK).exists()


def test_show_summarises_first_then_diffs_the_work(workspace: Path, tmp_path: Path) -> None:
    profile = tmp_path / "env.toml"
    profile.write_text(ENVIRONMENT_PROFILE)
    changeset = kept_id(run_copy(workspace, INSTALL, "--profile", str(profile)))
    shown = show(changeset)
    assert shown.returncode == 0, shown.stderr
    head = shown.stdout.split("\n\n", 1)[0].splitlines()
    assert len(head) <= 2 + MAX_LINES and head[2].startswith("1,508 changes")
    assert "+print(1)" in shown.stdout and f"added {HOOK} [git-hook, new-executable]" in shown.stdout
    assert "node_modules: 250 packages, 500 files" in shown.stdout
    assert "module.exports" not in shown.stdout and "site-packages" not in shown.stdout  # summed up, not diffed
    assert len(shown.stdout.splitlines()) < 200


def test_show_stat_is_one_line_per_entry(workspace: Path) -> None:
    changeset = kept_id(run_copy(workspace, "echo 'print(2)' >> src/app.py; echo new > new.txt; rm README.md"))
    stat = show(changeset, "--stat")
    assert stat.returncode == 0, stat.stderr
    body = stat.stdout.split("\n\n", 1)[1].splitlines()
    assert body == ["README.md  | +0 -1", "new.txt    | +1 -0", "src/app.py | +1 -0"]


def test_show_filters_by_path_and_by_flag(workspace: Path) -> None:
    changeset = kept_id(run_copy(workspace, INSTALL))
    one = show(changeset, "node_modules/p7", "--stat")
    assert one.stdout.split("\n\n", 1)[1].splitlines() == [
        "node_modules/p7              | added dir",
        "node_modules/p7/index.js     | +1 -0",
        "node_modules/p7/package.json | +1 -0",
    ]
    only = show(changeset, "--only", "node_modules/p7/index.js")
    assert "+module.exports = 7" in only.stdout and "p8" not in only.stdout
    flagged = show(changeset, "--flagged", "--json")
    paths = {
        line.split(" ")[1] for line in json.loads(flagged.stdout)["diff"].splitlines() if line.startswith("added ")
    }
    assert HOOK in paths and "src/app.py" not in paths and not any(p.startswith("node_modules") for p in paths)
    unknown = show(changeset, "no/such/path")
    assert unknown.returncode == 2 and "not in changeset" in unknown.stderr


def test_prune_removes_applied_changesets_and_discard_all_the_rest(workspace: Path) -> None:
    applied = kept_id(run_copy(workspace, "echo a > a.txt", "--apply"))
    first, second = (kept_id(run_copy(workspace, f"echo {n} > {n}.txt")) for n in "bc")
    pruned = sandbox("changes", "prune", "--all-applied", "--json", text=True)
    assert pruned.returncode == 0, pruned.stderr
    assert [(p["id"], p["why"]) for p in json.loads(pruned.stdout)["pruned"]] == [(applied, "applied")]
    other = sandbox("changes", "discard", "--all", "--workspace", str(workspace.parent), text=True)
    assert other.returncode == 0 and "discarded 0 kept changesets" in other.stderr
    gone = sandbox("changes", "discard", "--all", "--workspace", str(workspace), "--json", text=True)
    assert sorted(json.loads(gone.stdout)["discarded"]) == sorted([first, second])
    listed = sandbox("changes", "list", "--json", text=True)
    assert json.loads(listed.stdout)["changesets"] == []
    both = sandbox("changes", "discard", first, "--all", text=True)
    assert both.returncode == 2


@pytest.mark.anyio
async def test_mcp_changes_of_a_large_copy_session_are_summed_up(workspace: Path) -> None:
    from tests.integration.test_mcp import connect
    from tests.mcp_support import data, text

    async with connect(workspace, "--mount", "copy") as s:
        ran = await s.call_tool("Bash", {"command": INSTALL.split("; echo 'print(1)'")[0] + "; " + NEW_TOOL})
        changes = await s.call_tool("SandboxChanges", {})
    assert not ran.is_error and not changes.is_error
    content = text(changes).splitlines()
    assert len(content) <= MAX_LINES + 1, content  # the summary, and the note that the session keeps them
    assert content[0].startswith("1,506 changes") and "A tools/run  [new-executable]" in content
    assert len(data(changes)["details"]["changes"]) == 1506  # the data keeps every entry
