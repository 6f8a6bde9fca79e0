"""Git-aware review without a jail: real ``git`` builds the host repository and acts as the jail in
the private copy (only ever before a risky key is planted: those are written as text)."""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import TYPE_CHECKING

import pytest

from sandbox import changes
from sandbox.mounts import gitobeyed, gitreview
from sandbox.mounts.gitconfig import ConfigError, parse_config

if TYPE_CHECKING:
    from pathlib import Path

    from sandbox.mounts import CopyTree

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed"),
]
ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_AUTHOR_NAME": "Ann",
    "GIT_AUTHOR_EMAIL": "ann@x",
    "GIT_COMMITTER_NAME": "Ann",
    "GIT_COMMITTER_EMAIL": "ann@x",
    "PATH": os.environ["PATH"],
}


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, env=ENV, check=True)
    return done.stdout.strip()


@pytest.fixture
async def tree(tmp_path: Path) -> CopyTree:
    from sandbox.mounts import CopyTree

    ws = tmp_path / "ws"
    ws.mkdir()
    git(ws, "init", "-q", "-b", "main")
    (ws / "app.py").write_text("print('hello')\n")
    git(ws, "add", "app.py")
    git(ws, "commit", "-q", "-m", "first")
    (tmp_path / "copies").mkdir()
    return await CopyTree.prepare(ws, tmp_path / "copies")


async def keep(tree: CopyTree) -> changes.Kept:
    kept = await changes.keep(tree, await tree.changes(), source="run", profile="default", backend="bwrap")
    tree.remove()  # the summary and the apply must not need the private tree
    return changes.load(kept.id)


def commit(repo: Path, message: str, name: str = "app.py", *extra: str) -> str:
    (repo / name).write_text(f"{message}\n")
    git(repo, "add", name)
    git(repo, "commit", "-q", *extra, "-m", message)
    return git(repo, "rev-parse", "HEAD")


def append_config(tree: CopyTree, text: str) -> None:
    with open(tree.root / ".git" / "config", "a", encoding="utf-8") as fh:
        fh.write(text)


async def test_a_commit_is_summarised_and_applied_as_one_group(tree: CopyTree) -> None:
    old = git(tree.workspace, "rev-parse", "HEAD")
    new = commit(tree.root, "fix parser")
    kept = await keep(tree)
    assert kept.git is not None and kept.git.risky == []
    assert kept.git.refs == [
        {
            "ref": "refs/heads/main",
            "change": "moved",
            "old": old,
            "new": new,
            "commits": [{"id": new, "subject": "fix parser", "author": "Ann <ann@x>"}],
            "packed": False,
        }
    ]
    assert kept.git.index == {"changed": True, "paths_differ": 1}
    lines = kept.git_lines()
    assert f'git: 1 new commit on main: {new[:7]} "fix parser" (Ann <ann@x>)' in lines
    assert "git: index changed (1 path differs)" in lines
    objects = [e.change for e in kept.entries if e.change.path.startswith(".git/objects/")]
    assert objects and all(c.flags == [] for c in objects)  # no longer a dotfile each
    assert ".git/" not in kept.diff() and "+fix parser" in kept.diff()
    report = await kept.apply()
    assert report.held_back == [] and report.conflicts == []
    assert git(tree.workspace, "log", "-1", "--format=%H %s") == f"{new} fix parser"
    git(tree.workspace, "fsck", "--strict")


async def test_a_new_branch_and_head_are_summarised(tree: CopyTree) -> None:
    git(tree.root, "checkout", "-q", "-b", "topic")
    new = commit(tree.root, "on topic", "topic.txt")
    kept = await keep(tree)
    assert kept.git is not None
    assert kept.git.head == ["ref: refs/heads/main", "ref: refs/heads/topic"]
    (topic,) = kept.git.refs
    assert (topic["ref"], topic["change"], topic["old"], topic["new"]) == ("refs/heads/topic", "created", None, new)
    assert [c["subject"] for c in topic["commits"]] == ["on topic"]


async def test_an_amended_commit_moves_the_ref_with_one_new_commit(tree: CopyTree) -> None:
    old = git(tree.workspace, "rev-parse", "HEAD")
    new = commit(tree.root, "first, amended", "app.py", "--amend")
    kept = await keep(tree)
    assert kept.git is not None
    (main,) = kept.git.refs
    assert (main["change"], main["old"], main["new"]) == ("moved", old, new)
    assert [c["subject"] for c in main["commits"]] == ["first, amended"]


async def test_several_commits_are_listed_newest_first(tree: CopyTree) -> None:
    for n in range(3):
        commit(tree.root, f"change {n}")
    kept = await keep(tree)
    assert kept.git is not None
    assert [c["subject"] for c in kept.git.refs[0]["commits"]] == ["change 2", "change 1", "change 0"]
    assert "git: 3 new commits on main:" in kept.git_lines()


async def test_packed_commits_are_counted_not_read(tree: CopyTree) -> None:
    commit(tree.root, "to be packed")
    git(tree.root, "gc", "-q")
    kept = await keep(tree)
    assert kept.git is not None
    assert kept.git.refs[0]["packed"] is True and kept.git.refs[0]["commits"] == []
    assert "git: new commits on main are packed, not summarised" in kept.git_lines()
    await kept.apply()
    git(tree.workspace, "fsck", "--strict")
    assert git(tree.workspace, "log", "-1", "--format=%s") == "to be packed"


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("[core]\n\tfsmonitor = ./x\n", "core.fsmonitor"),
        ("[core]\n\tpager = ./x\n", "core.pager"),
        ("[Core]\n\tHooksPath = /tmp\n", "core.hookspath"),
        ("[core]\n\tsshCommand = ./x\n", "core.sshcommand"),
        ('[filter "lfs"]\n\tclean = ./x\n', "filter.lfs.clean"),
        ('[diff "pdf"]\n\ttextconv = ./x\n', "diff.pdf.textconv"),
        ('[merge "m"]\n\tdriver = ./x %A\n', "merge.m.driver"),
        ("[credential]\n\thelper = !./x\n", "credential.helper"),
        ('[url "ext::sh -c x"]\n\tinsteadOf = https://\n', "url.ext::sh -c x.insteadof"),
        ("[include]\n\tpath = ../evil\n", "include.path"),
        ('[includeIf "gitdir:/"]\n\tpath = ../evil\n', "includeif.gitdir:/.path"),
        ("[alias]\n\tst = !./x\n", "alias.st"),
        ('[remote "origin"]\n\tuploadpack = ./x\n', "remote.origin.uploadpack"),
        ("[Filter.LFS]\n\tsmudge = ./x\n", "filter.lfs.smudge"),  # the deprecated [section.sub] form
    ],
)
async def test_each_risky_key_holds_the_whole_group_back(tree: CopyTree, text: str, key: str) -> None:
    commit(tree.root, "with a config change")
    append_config(tree, text)
    kept = await keep(tree)
    assert kept.git is not None
    risky = [c for c in kept.git.config if c["risky"]]
    assert [c["key"] for c in risky] == [key]
    assert kept.git.risky
    config = next(e.change for e in kept.entries if e.change.path == ".git/config")
    assert config.flags == ["git-config"]
    report = await kept.apply()
    assert report.held_back == [
        {
            "path": ".git",
            "flags": ["git-config"],
            "group": "git",
            "entries": len(kept._git_group()),
            "risky": kept.git.risky,
        }
    ]
    assert "+with a config change" not in git(tree.workspace, "log", "--format=+%s")
    assert (tree.workspace / "app.py").read_text() == "with a config change\n"  # the rest is applied


async def test_a_benign_config_change_is_listed_and_not_held_back(tree: CopyTree) -> None:
    append_config(tree, '[branch "main"]\n\tremote = origin\n')
    kept = await keep(tree)
    assert kept.git is not None and kept.git.risky == []
    assert "git: config branch.main.remote = origin (added)" in kept.git_lines()
    assert (await kept.apply()).held_back == []
    assert "remote = origin" in (tree.workspace / ".git" / "config").read_text()


async def test_naming_one_git_entry_applies_the_whole_group(tree: CopyTree) -> None:
    new = commit(tree.root, "named")
    append_config(tree, "[core]\n\tfsmonitor = ./x\n")
    kept = await keep(tree)
    one = next(e.change.path for e in kept.entries if e.change.path.startswith(".git/objects/"))
    report = await kept.apply([one])
    assert sorted(report.applied) == sorted(kept._git_group())
    # the ref read as a file: git itself never runs in a repository whose config has an fsmonitor
    assert (tree.workspace / ".git" / "refs" / "heads" / "main").read_text().strip() == new
    assert (tree.workspace / "app.py").read_text() == "print('hello')\n"  # only the group was named


async def test_only_dot_git_names_the_group(tree: CopyTree) -> None:
    commit(tree.root, "named by .git")
    kept = await keep(tree)
    report = await kept.apply([".git"])
    assert sorted(report.applied) == sorted(kept._git_group())


async def test_a_group_the_host_changed_meanwhile_is_not_applied_in_part(tree: CopyTree) -> None:
    commit(tree.root, "in the jail")
    kept = await keep(tree)
    ours = commit(tree.workspace, "on the host meanwhile", "host.txt")
    report = await kept.apply()
    assert report.conflicts[-1]["path"] == ".git"
    assert not any(p.startswith(".git") for p in report.applied)
    assert (tree.workspace / "app.py").read_text() == "in the jail\n"  # the rest is applied
    assert git(tree.workspace, "rev-parse", "HEAD") == ours
    git(tree.workspace, "fsck", "--strict")


async def test_a_new_hook_is_risky_and_a_sample_is_not(tree: CopyTree) -> None:
    hook = tree.root / ".git" / "hooks" / "post-checkout"
    hook.write_text("#!/bin/sh\ntouch /tmp/pwned\n")
    hook.chmod(0o755)
    (tree.root / ".git" / "hooks" / "new.sample").write_text("#!/bin/sh\n")
    kept = await keep(tree)
    assert kept.git is not None
    flags = {e.change.path: e.change.flags for e in kept.entries}
    assert set(flags[".git/hooks/post-checkout"]) == {"git-hook", "new-executable"}
    assert flags[".git/hooks/new.sample"] == []
    assert "git: RISKY hook .git/hooks/post-checkout (added)" in kept.git_lines()
    assert (await kept.apply()).held_back[0]["group"] == "git"
    assert not (tree.workspace / ".git" / "hooks" / "post-checkout").exists()


async def test_an_entry_outside_gits_data_is_a_risky_dotfile(tree: CopyTree) -> None:
    (tree.root / ".git" / "commondir").write_text("/elsewhere\n")
    kept = await keep(tree)
    assert kept.git is not None
    assert "git: RISKY .git/commondir (added) [dotfile]" in kept.git_lines()


async def test_gitmodules_is_reported(tree: CopyTree) -> None:
    (tree.root / ".gitmodules").write_text('[submodule "x"]\n\tpath = x\n\turl = ext::sh -c evil\n')
    kept = await keep(tree)
    assert kept.git is not None and kept.git.gitmodules == "added"
    assert any(line.startswith("git: .gitmodules added") for line in kept.git_lines())


async def test_a_subject_cannot_drive_the_terminal(tree: CopyTree) -> None:
    commit(tree.root, "evil \x1b]0;title\x07 subject")
    kept = await keep(tree)
    text = "\n".join(kept.git_lines())
    assert "\x1b" not in text and "\x07" not in text and "\\x1b" in text


async def test_a_workspace_without_a_repository_has_no_summary(tmp_path: Path) -> None:
    from sandbox.mounts import CopyTree

    ws = tmp_path / "plain"
    ws.mkdir()
    (tmp_path / "copies").mkdir()
    tree = await CopyTree.prepare(ws, tmp_path / "copies")
    (tree.root / ".git").mkdir()
    (tree.root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    kept = await keep(tree)
    assert kept.git is None
    assert {e.change.path: e.change.flags for e in kept.entries}[".git/HEAD"] == ["dotfile"]


def test_config_parser_reads_gits_syntax() -> None:
    text = (
        b"# comment\n[core]\n\tbare = false ; trailing\n\tFileMode\n"
        b'[remote "Origin"]\n\turl = "a b"#c\n\tfetch = +refs/*:refs/*\n'
        b"[alias]\n\tlg = log \\\n --oneline\n[Diff.Pdf]\n\tTextConv = x\n"
    )
    assert parse_config(text) == {
        "core.bare": ["false"],
        "core.filemode": ["true"],
        "remote.Origin.url": ["a b"],
        "remote.Origin.fetch": ["+refs/*:refs/*"],
        "alias.lg": ["log  --oneline"],
        "diff.pdf.textconv": ["x"],
    }


@pytest.mark.parametrize("text", [b"key = x\n", b"[core\n", b'[core]\n\tx = "open\n', b"[core]\n\tx = a\\q\n"])
def test_config_the_parser_does_not_understand_is_refused(text: bytes) -> None:
    with pytest.raises(ConfigError):
        parse_config(text)


def test_risky_keys_match_by_pattern() -> None:
    assert gitreview.risky_key("filter.lfs.process") is not None
    assert gitreview.risky_key("diff.x.textconv") is not None
    assert gitreview.risky_key("diff.x.binary") is None
    assert gitreview.risky_key("user.name") is None


async def test_unparseable_new_config_is_risky(tree: CopyTree) -> None:
    append_config(tree, "[core\n")
    kept = await keep(tree)
    assert kept.git is not None
    assert any(r.startswith(".git/config:") for r in kept.git.risky)


# -- what the host's git obeys (issue 31: the host's tools never run what the jail wrote) ----------


async def test_a_rebase_todo_in_progress_is_risky(tree: CopyTree) -> None:
    """A todo's ``exec`` lines run on ``git rebase --continue``: not git's data."""
    (tree.root / ".git" / "rebase-merge").mkdir()
    (tree.root / ".git" / "rebase-merge" / "git-rebase-todo").write_text("exec touch /tmp/x\n")
    kept = await keep(tree)
    assert kept.git is not None
    assert any("rebase-merge/git-rebase-todo" in reason for reason in kept.git.risky)


async def test_the_hooks_path_directory_and_hook_managers_are_flagged(tmp_path: Path) -> None:
    """An existing executable hook rewritten in ``core.hooksPath``'s directory keeps its mode: it
    is flagged for where it is, as lefthook's configuration (no dotfile) is."""
    from sandbox.mounts import CopyTree

    ws = tmp_path / "ws"
    git(tmp_path, "init", "-q", "ws")
    hook = ws / "tools" / "githooks" / "pre-commit"
    hook.parent.mkdir(parents=True)
    hook.write_text("#!/bin/sh\nexit 0\n")
    hook.chmod(0o755)
    (ws / "lefthook.yml").write_text("pre-commit: {}\n")
    (ws / "app.py").write_text("print('hello')\n")
    git(ws, "config", "core.hooksPath", "tools/githooks")
    (tmp_path / "copies").mkdir()
    tree = await CopyTree.prepare(ws, tmp_path / "copies")
    (tree.root / "tools" / "githooks" / "pre-commit").write_text("#!/bin/sh\ntouch /tmp/x\n")
    (tree.root / "lefthook.yml").write_text("pre-commit:\n  commands:\n    x:\n      run: touch /tmp/x\n")
    (tree.root / "app.py").write_text("print('changed')\n")
    found = {c.path: c.flags for c in (await tree.changes()).changes}
    tree.remove()
    assert found == {"tools/githooks/pre-commit": ["git-hook"], "lefthook.yml": ["git-hook"], "app.py": []}


def test_obeyed_lists_every_git_directory_and_what_points_at_one(tmp_path: Path) -> None:
    ws, lib = tmp_path / "ws", tmp_path / "lib"
    git(tmp_path, "init", "-q", "-b", "main", str(lib))
    git(lib, "commit", "-q", "--allow-empty", "-m", "lib")
    git(tmp_path, "init", "-q", "-b", "main", str(ws))
    git(ws, "config", "core.hooksPath", ".githooks")
    (ws / ".husky").mkdir()
    git(ws, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(lib), "deps/lib")
    git(ws, "commit", "-q", "-m", "first")
    git(ws, "worktree", "add", "-q", str(ws / "inner-wt"))
    git(ws, "init", "-q", "vendor/x")
    found = gitobeyed.obeyed(ws, ["vendor/x", "deps/lib", "inner-wt"])
    assert found is not None
    assert found.gitdirs == (".git", ".git/modules/deps/lib", "vendor/x/.git")
    for path in (".git/config", ".git/hooks", ".git/worktrees", ".git/modules/deps/lib/config", "vendor/x/.git/hooks"):
        assert path in found.protected
    for path in (".husky", ".gitmodules", "deps/lib/.git", "inner-wt/.git"):
        assert path in found.protected
    assert ".githooks" in found.missing  # made, then sealed (sandbox/backends/seal.py)
    assert gitobeyed.obeyed(tmp_path / "lib" / ".git") == gitobeyed.Obeyed((), (), ())


def test_a_hooks_path_outside_the_workspace_is_not_ours_to_seal(tmp_path: Path) -> None:
    git(tmp_path, "init", "-q", "ws")
    for value, expected in (("../elsewhere", None), ("/etc/hooks", None), ("hooks", "hooks"), (".", None)):
        git(tmp_path / "ws", "config", "core.hooksPath", value)
        assert gitobeyed.hooks_dir(tmp_path / "ws") == expected


def test_includes_are_followed_inside_the_workspace_only(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    git(tmp_path, "init", "-q", "ws")
    git(ws, "config", "include.path", "../team.gitconfig")
    git(ws, "config", "--add", "include.path", "/etc/gitconfig")
    git(ws, "config", "includeIf.gitdir:~/work/.path", "../conf/mine")
    (ws / "team.gitconfig").write_text("[include]\n\tpath = nested/more\n")
    assert gitobeyed.includes(ws) == ["team.gitconfig", "conf/mine", "nested/more"]
    assert gitobeyed.obeyed(ws).missing_files == ("conf/mine", "nested/more")
