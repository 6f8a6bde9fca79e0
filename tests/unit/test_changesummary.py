"""A changeset a person can read (:mod:`sandbox.changesummary`), and the store's retention
(:func:`sandbox.changes.prune`, :func:`~sandbox.changes.discard_all`, the size cap): pure, no jail."""

from __future__ import annotations

import json
import time
from datetime import timedelta
from typing import TYPE_CHECKING

import pytest

from sandbox import changes, changesummary
from sandbox.changesummary import Rules, summary_lines, total_line
from sandbox.mounts import Change, CopyTree
from tests.unit.copy_trees import copy_of

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.anyio
HOOK = ".git/hooks/pre-commit"


def packages(dirs: int = 500, files: int = 10, root: str = "node_modules") -> list[Change]:
    """``dirs`` package directories of ``files`` files each, as an install leaves them."""
    found = []
    for d in range(dirs):
        found.append(Change(f"{root}/pkg{d}", "added", "dir", size=4096))
        found += [Change(f"{root}/pkg{d}/f{f}.js", "added", "file", size=1000) for f in range(files)]
    return found


def test_the_total_line_counts_each_status_and_the_bytes_of_files() -> None:
    entries = [Change(f"a/{i}", "added", "file", size=1024) for i in range(14_180)]
    entries += [Change(f"m/{i}", "modified", "file", size=1024) for i in range(30)]
    entries += [Change(f"d/{i}", "deleted", "file", size=1024) for i in range(2)]
    entries.append(Change("a", "added", "dir", size=4096))  # a directory's size is no content
    assert total_line(entries) == "14,213 changes (14,181 added, 30 modified, 2 deleted), 14 MiB"


def test_five_thousand_entries_across_500_package_dirs_fit_in_20_lines() -> None:
    entries = [*packages(), *packages(100, 5, ".venv/lib/site-packages")]
    entries += [Change("src/app.py", "modified", "file", size=10), Change("README.md", "modified", "file", size=9)]
    lines = [total_line(entries), *summary_lines(entries, Rules(), changeset_id="ch-0123456789ab")]
    assert len(lines) <= changesummary.MAX_LINES
    assert any(line.startswith("node_modules/: 5,500 changes") for line in lines), lines
    assert "M src/app.py" in lines and "M README.md" in lines


def test_environment_directories_are_one_line_each_with_their_packages() -> None:
    entries = packages() + [Change(f"node_modules/pkg{d}/package.json", "added", "file", size=2) for d in range(500)]
    entries += packages(31, 90, ".venv/lib/python3/site-packages")
    entries += [Change(f"pkg{i}/__pycache__/m.pyc", "added", "file", size=5) for i in range(30)]
    rules = Rules(environment=(".venv", "node_modules", "__pycache__"))
    lines = summary_lines(entries, rules, changeset_id="ch-0123456789ab")
    assert len(lines) == 3, lines
    node = next(line for line in lines if line.startswith("node_modules: "))
    assert "500 packages, 5,500 files" in node and "--only node_modules or --include-environment" in node
    assert any(line.startswith(".venv: ") and "2,790 files" in line for line in lines)
    assert "__pycache__ (30 directories): 30 files, 150 bytes" in " ".join(lines)


def test_flagged_entries_are_always_named() -> None:
    entries = packages()
    flagged = [
        Change(HOOK, "added", "file", ["git-hook", "new-executable"], size=20),
        Change("tools/run", "added", "file", ["new-executable"], size=20),
        Change("bad/link", "added", "symlink", ["symlink-outside"], target="/etc/shadow", applicable=False),
    ]
    lines = summary_lines([*entries[:2500], *flagged, *entries[2500:]], Rules(), changeset_id="ch-0123456789ab")
    for change in flagged:
        assert any(line.startswith(changesummary.item_line(change)) for line in lines), (change.path, lines)
    assert any("never applied" in line for line in lines)


def test_what_runs_by_itself_is_named_before_new_executables_and_dotfiles() -> None:
    tools = [Change(f"!{c}/run", "added", "file", ["new-executable"], size=1) for c in "abcdefgh"]
    dotfiles = [Change(f"!{c}/.rc", "added", "file", ["dotfile"], size=1) for c in "abcdefgh"]
    severe = [
        Change("zz/hook", "added", "file", ["git-hook"], size=1),
        Change("zz/suid", "added", "file", ["setuid"], size=1),
        Change("zz/link", "added", "symlink", ["symlink-outside"], target="/etc/passwd"),
        Change("zz/python", "added", "symlink", ["system-link"], target="/usr/bin/python3"),  # needs no consent
    ]
    lines = summary_lines([*dotfiles, *tools, *severe], Rules(), changeset_id="ch-0123456789ab")
    assert lines[:3] == [changesummary.item_line(c) for c in (severe[0], severe[2], severe[1])]
    assert lines[3] == changesummary.item_line(tools[0])
    assert "and 15 more flagged: sandbox changes show ch-0123456789ab --flagged" in lines


def test_past_the_cap_flagged_entries_point_at_show_flagged_and_a_hook_is_not_crowded_out() -> None:
    dotfiles = [Change(f".config/app{i}", "added", "file", ["dotfile"], size=1) for i in range(1000)]
    hook = Change(HOOK, "added", "file", ["git-hook", "new-executable"], size=20)
    lines = summary_lines([*dotfiles, hook], Rules(), changeset_id="ch-0123456789ab")
    assert lines[0] == changesummary.item_line(hook)
    more = 1001 - (changesummary.FLAGGED_CAP - 1)
    assert f"and {more:,} more flagged: sandbox changes show ch-0123456789ab --flagged" in lines
    assert len(lines) <= changesummary.MAX_LINES - 1


def test_a_small_changeset_stays_itemised() -> None:
    entries = [
        Change("README.md", "modified", "file", size=9),
        Change("new.txt", "added", "file", size=4),
        Change(".env.example", "added", "file", ["dotfile"], size=4),
        Change("old.txt", "deleted", "file"),
    ]
    assert summary_lines(entries, Rules()) == ["M README.md", "A new.txt", "A .env.example  [dotfile]", "D old.txt"]


def test_a_dominant_directory_is_split_deeper() -> None:
    entries = [Change(f"src/pkg/a/m{i}.py", "added", "file", size=1) for i in range(40)]
    entries += [Change(f"src/pkg/b/m{i}.py", "modified", "file", size=1) for i in range(30)]
    entries += [Change("docs/index.md", "modified", "file", size=1), Change("docs/api.md", "added", "file", size=1)]
    lines = summary_lines(entries, Rules())
    assert lines == [
        "docs/: 2 changes (1 added, 1 modified), 2 bytes",
        "src/pkg/a/: 40 changes (40 added), 40 bytes",
        "src/pkg/b/: 30 changes (30 modified), 30 bytes",
    ]


def test_too_many_directories_are_summed_in_a_last_line() -> None:
    entries = [Change(f"d{i}/f{j}", "added", "file", size=1) for i in range(100) for j in range(3)]
    lines = summary_lines(entries, Rules(), budget=10)
    assert len(lines) == 10 and lines[-1] == "and 91 more directories: 273 changes (273 added), 273 bytes"


def test_ignored_noise_is_one_line_from_the_profile_and_the_gitignore(tmp_path: Path) -> None:
    (tmp_path / ".gitignore").write_text("# build output\nbuild/\n*.egg-info\n!keep.log\n")
    rules = Rules.of(tmp_path, ignore=["*.log"])
    entries = [Change(f"build/lib/m{i}.py", "added", "file", size=1) for i in range(50)]
    entries += [Change("pkg.egg-info/PKG-INFO", "added", "file", size=1), Change("run.log", "added", "file", size=1)]
    entries += [Change("keep.log", "added", "file", size=1), Change("src/app.py", "modified", "file", size=1)]
    entries.append(Change("build/.hidden", "added", "file", ["dotfile"], size=1))
    lines = summary_lines(entries, rules)
    noise = "ignored (mount.ignore, .gitignore): 54 changes (54 added), 54 bytes; kept and applied as the rest"
    assert lines[0] == noise
    assert "A keep.log" not in lines  # the profile's *.log comes after the .gitignore's !keep.log: ignored
    assert "M src/app.py" in lines and "A build/.hidden  [dotfile]" in lines  # flagged noise is still named


def test_a_long_git_summary_keeps_its_risks_and_its_verdict() -> None:
    refs = [f"git: new tag v{i}" for i in range(500)]
    risky = ["git: RISKY hook .git/hooks/post-checkout (added)", "git: RISKY core.pager = x (added)"]
    verdict = "git: 503 entries under .git, one group: risky, held back without consent (--only .git)"
    git = [Change(".git/refs/tags/v1", "added", "file", size=41)]
    lines = summary_lines(git, Rules(), git_lines=[*refs, *risky, verdict], git_group={".git/refs/tags/v1"})
    assert len(lines) == changesummary.GIT_CAP
    assert lines[-4:] == [*risky, verdict, "git: 496 more lines: sandbox changes show ID"]


def test_names_cannot_forge_a_line() -> None:
    entries = [Change("a\nsandbox: applied everything", "added", "file", size=1)]
    entries += [Change(f"x/\x1b[2J{i}", "added", "file", ["dotfile"], size=1) for i in range(30)]
    lines = [total_line(entries), *summary_lines(entries, Rules())]
    assert all(line.isprintable() for line in lines), lines


def test_stat_counts_lines_for_text_and_sizes_otherwise(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    (tmp_path / "kept").mkdir()
    (tmp_path / "ws" / "app.py").write_text("a\nb\nc\n")
    (tmp_path / "kept" / "app.py").write_text("a\nB\nc\nd\n")
    (tmp_path / "kept" / "blob.bin").write_bytes(b"\0" * 100)
    entries = [
        Change("app.py", "modified", "file", size=8),
        Change("blob.bin", "added", "file", ["new-executable"], size=100),
        Change("gone.txt", "deleted", "file"),
        Change("link", "added", "symlink", target="app.py"),
    ]
    lines = changesummary.stat_lines(entries, tmp_path / "ws", tmp_path / "kept")
    assert lines == [
        "app.py   | +2 -1",
        "blob.bin | added, 100 bytes (binary or large)  [new-executable]",
        "gone.txt | +0 -0",
        "link     | added symlink -> app.py",
    ]


# -- retention --------------------------------------------------------------------------------------


async def kept_one(tmp_path: Path, name: str, size: int = 10) -> changes.Kept:
    tree: CopyTree = await copy_of(tmp_path / name, {"README.md": "# sample\n"})
    (tree.root / "big.bin").write_bytes(b"x" * size)
    kept = await changes.keep(tree, await tree.changes(), source="run", profile="default", backend="bwrap")
    tree.remove()
    return kept


def age(kept: changes.Kept, days: float) -> None:
    """Make ``kept`` look kept ``days`` ago (the manifest's ``created``; it has whole seconds)."""
    manifest = kept.path / changes.MANIFEST
    data = json.loads(manifest.read_text())
    data["created"] = (kept.created - timedelta(days=days)).isoformat(timespec="seconds")
    manifest.write_text(json.dumps(data))


async def test_an_applied_changeset_goes_a_day_after_its_apply(tmp_path: Path) -> None:
    applied, pending = await kept_one(tmp_path, "a"), await kept_one(tmp_path, "b")
    await applied.apply()
    assert changes.load(applied.id).state == "applied"
    assert changes.sweep(time.time() + changes.APPLIED_RETENTION_S - 60) == []
    assert changes.sweep(time.time() + changes.APPLIED_RETENTION_S + 60) == [applied.id]
    assert [k.id for k in changes.listing()] == [pending.id]  # not applied: kept its 14 days


async def test_prune_all_applied_and_older_than(tmp_path: Path) -> None:
    applied, old, new = [await kept_one(tmp_path, n, 1000) for n in "abc"]
    await applied.apply()
    pruned = changes.prune(all_applied=True)
    assert [(p.id, p.why) for p in pruned] == [(applied.id, "applied")] and pruned[0].bytes > 1000
    in_three_days = time.time() + 3 * 86400
    assert changes.prune(older_than_days=7, now=in_three_days) == []
    assert {p.id for p in changes.prune(older_than_days=2, now=in_three_days)} == {old.id, new.id}
    assert changes.listing() == []


async def test_discard_all_of_one_workspace(tmp_path: Path) -> None:
    first, second = await kept_one(tmp_path, "a"), await kept_one(tmp_path, "b")
    assert changes.discard_all(second.workspace) == [second.id]
    assert [k.id for k in changes.listing()] == [first.id]
    assert changes.discard_all() == [first.id]


async def test_a_full_store_prunes_applied_then_the_oldest_and_says_so(tmp_path: Path) -> None:
    applied, old, mid = [await kept_one(tmp_path, n, 40_000) for n in "abc"]
    await applied.apply()
    for kept, days in ((applied, 1), (old, 3), (mid, 2)):
        age(kept, days)
    tree: CopyTree = await copy_of(tmp_path / "d", {"README.md": "# sample\n"})
    (tree.root / "big.bin").write_bytes(b"x" * 40_000)
    new = await changes.keep(tree, await tree.changes(), source="run", profile="p", backend="bwrap", limit=100_000)
    assert [(p.id, p.why) for p in new.pruned] == [
        (applied.id, "applied; the store was full"),
        (old.id, "oldest; the store was full"),
    ]
    assert [k.id for k in changes.listing()] == [mid.id, new.id]
