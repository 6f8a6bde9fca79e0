"""The host's tools never run what the jail wrote (issue 31, category 2), tested as a user meets it.

The workspace is a real repository: a commit, a bare "remote" on local disk, a submodule, a linked
worktree outside the workspace, an embedded repository (``vendor/lib``), a shared config file the
repository includes (and one it would include), ``extensions.worktreeConfig`` on, and a
``core.hooksPath`` directory in the worktree whose dispatcher runs what husky (``.husky/<hook>``)
and lefthook (``lefthook.yml``'s ``run:`` lines) would. The jail then tries every route we know to
make git run a command later (:data:`ROUTES`): hooks wherever they are looked up, config keys
(fsmonitor, filters, textconv, includes, uploadpack, a worktree config), attributes selecting
drivers, included files, alternates, ``commondir``, a linked worktree's ``commondir``, a
submodule's ``gitdir`` file and its git directory, a rebase todo, hook managers' files, renaming a
sealed directory away, and a repository planted inside the workspace. Each payload is ``touch
<marker>`` on the host. Then (``copy``/``overlay``: after an apply without consent) the host runs
real ``git status``, ``log``, ``diff``, ``commit``, ``checkout``, ``fetch`` and ``rebase
--continue`` in the workspace, the submodule, the embedded repository and the worktree: no marker
may exist. ``ro`` is attacked alike. What no mount can close in ``rw`` (a new ``commondir`` or
rebase todo in a writable ``.git``) is moved away after the call (:mod:`sandbox.gitsweep`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from sandbox import exec as executor
from sandbox import gitsweep
from sandbox.session import Sandbox
from sandbox.tools.bash import run_bash
from sandbox.tools.params import BashParams
from tests.attack.conftest import mode_profile
from tests.conftest import backend_or_skip, own_like_a_checkout
from tests.integration._cli import sandbox

if TYPE_CHECKING:
    from sandbox.backends import base
    from tests.conftest import JailFactory

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed"),
]
# The host user's git, with no system or global configuration of this machine's to blur the test;
# safe.directory: Docker tests hand the workspace to uid 1000, and these are our own fixtures.
HOST_GIT = ["git", "-c", "safe.directory=*", "-c", "protocol.file.allow=always", "-c", "user.name=U"]
ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "PATH": os.environ["PATH"], "HOME": "/"}
DISPATCHER = """#!/bin/sh
# An installed hook manager's dispatcher: husky runs .husky/<hook>, lefthook the run: lines of lefthook.yml.
[ -f .husky/pre-commit ] && sh .husky/pre-commit
[ -f lefthook.yml ] && sed -n 's/^ *run: //p' lefthook.yml | sh
exit 0
"""


def git(repo: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    argv = [*HOST_GIT, "-c", "user.email=u@x", "-C", str(repo), *args]
    return subprocess.run(argv, capture_output=True, text=True, env=ENV, check=check, timeout=60)


def executable(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)


@pytest.fixture
def repo(workspace: Path, tmp_path: Path, backend: base.Backend) -> Path:
    """The workspace as a real repository with a remote, a submodule, a worktree and an embedded repository."""
    (tmp_path / "markers").mkdir()
    git(tmp_path, "init", "-q", "--bare", "remote.git")
    git(tmp_path, "init", "-q", "-b", "main", "libsrc")
    git(tmp_path / "libsrc", "commit", "-q", "--allow-empty", "-m", "lib")
    git(workspace, "init", "-q", "-b", "main")
    executable(workspace / "githooks" / "pre-commit", DISPATCHER)
    executable(workspace / "githooks" / "post-checkout", "#!/bin/sh\nexit 0\n")
    (workspace / ".husky").mkdir()
    (workspace / ".husky" / "pre-commit").write_text("true\n")
    (workspace / "lefthook.yml").write_text("pre-commit:\n  commands:\n    lint:\n      run: true\n")
    git(workspace, "config", "core.hooksPath", "githooks")
    git(workspace, "config", "extensions.worktreeConfig", "true")  # as `git sparse-checkout` sets it
    (workspace / "shared.gitconfig").write_text("[core]\n\tautocrlf = false\n")  # a team's shared settings
    git(workspace, "config", "include.path", "../shared.gitconfig")
    git(workspace, "config", "includeIf.onbranch:main.path", "../conf/local.gitconfig")  # none yet
    git(workspace, "submodule", "add", "-q", str(tmp_path / "libsrc"), "sub")
    git(workspace, "add", "-A")
    git(workspace, "commit", "-q", "-m", "first")
    git(workspace, "remote", "add", "origin", str(tmp_path / "remote.git"))
    git(workspace, "push", "-q", "origin", "main")
    git(workspace, "worktree", "add", "-q", "-b", "wt", str(tmp_path / "wt"))
    git(workspace, "init", "-q", "-b", "main", "vendor/lib")
    git(workspace / "vendor" / "lib", "commit", "-q", "--allow-empty", "-m", "vendored")
    (workspace / ".git" / "info" / "exclude").write_text("vendor/\nplanted/\nevil*\n")
    own_like_a_checkout(workspace, backend.name)
    return workspace


def evil_gitdir(name: str) -> str:
    """Shell: a git directory ``name`` in the workspace whose config runs fsmonitor (and hooks) on the host."""
    return (
        f"mkdir -p {name}/refs {name}/hooks {name}/objects; cp -r .git/objects {name}/; "
        f"echo 'ref: refs/heads/main' > {name}/HEAD; "
        f"printf '[core]\\n\\trepositoryformatversion = 0\\n\\tfsmonitor = touch %s/{name}\\n' \"$M\" > {name}/config; "
        f"p {name}-hook {name}/hooks/pre-commit; p {name}-hook {name}/hooks/post-checkout; "
    )


HOOKS = "pre-commit post-commit post-checkout reference-transaction post-merge pre-push post-rewrite"
ROUTES = {
    "hooks": f"for h in {HOOKS}; do p hook-$h .git/hooks/$h; p hookspath-$h githooks/$h; "
    "p module-hook-$h .git/modules/sub/hooks/$h; p vendor-hook-$h vendor/lib/.git/hooks/$h; done; ",
    "config": 'git config core.fsmonitor "touch $M/fsmonitor"; '
    "mkdir .evilhooks; p hookspath-new .evilhooks/pre-commit; git config core.hooksPath .evilhooks; "
    "printf '[core]\\n\\tfsmonitor = touch %s/include\\n' \"$M\" > evil.cfg; "
    'git config include.path "$PWD/evil.cfg"; '
    'git config filter.x.clean "touch $M/filter; cat"; git config filter.x.smudge "touch $M/filter; cat"; '
    'git config diff.x.textconv "touch $M/textconv; cat"; echo "* filter=x diff=x" > .gitattributes; '
    'echo "* filter=x diff=x" > .git/info/attributes; git config remote.origin.uploadpack "touch $M/uploadpack; :"; '
    "git config extensions.worktreeConfig true; "
    "printf '[core]\\n\\tfsmonitor = touch %s/worktree-config\\n' \"$M\" > .git/config.worktree; "
    'git -C sub config core.fsmonitor "touch $M/module-fsmonitor"; '
    'git -C vendor/lib config core.fsmonitor "touch $M/vendor-fsmonitor"; ',
    "redirect": evil_gitdir("evil.git")
    + evil_gitdir("evilsub.git")
    + 'echo "$PWD/evil.git" > .git/worktrees/wt/commondir; echo "gitdir: $PWD/evilsub.git" > sub/.git; '
    'echo "$PWD/evil.git/objects" > .git/objects/info/alternates; ',
    "includes": "printf '[core]\\n\\tfsmonitor = touch %s/included\\n' \"$M\" > shared.gitconfig; "
    "mkdir -p conf; printf '[core]\\n\\tfsmonitor = touch %s/included-if\\n' \"$M\" > conf/local.gitconfig; ",
    "managers": "printf 'touch %s/husky\\n' \"$M\" > .husky/pre-commit; "
    "printf 'pre-commit:\\n  commands:\\n    x:\\n      run: touch %s/lefthook\\n' \"$M\" > lefthook.yml; ",
    "renames": "mv githooks githooks.old && mkdir githooks && p renamed-hookspath githooks/pre-commit; "
    "mv .git/modules .git/modules.old && mkdir -p .git/modules/sub/hooks && cp -r .git/modules.old/sub/. "
    ".git/modules/sub/ && p renamed-module .git/modules/sub/hooks/post-checkout; "
    'mv sub sub.old && mkdir sub && echo "gitdir: $PWD/evilsub.git" > sub/.git; ' + evil_gitdir("evilsub.git"),
    "commondir": evil_gitdir("evil.git") + 'echo "$PWD/evil.git" > .git/commondir; ',
    "module-commondir": evil_gitdir("evil.git") + 'echo "$PWD/evil.git" > .git/modules/sub/commondir; ',
    "nested-commondir": evil_gitdir("evil.git") + 'echo "$PWD/evil.git" > vendor/lib/.git/commondir; ',
    "rebase": 'mkdir .git/rebase-merge && cd .git/rebase-merge && echo "exec touch $M/rebase" > git-rebase-todo && '
    "git rev-parse HEAD > onto && cp onto orig-head && echo refs/heads/main > head-name && touch interactive; "
    'cd "$W"; ',
    "planted": "git init -q planted; "
    f"for h in {HOOKS}; do p planted-hook-$h planted/.git/hooks/$h; done; "
    'git -C planted config core.fsmonitor "touch $M/planted-fsmonitor"; ',
}
"""The planting routes, by kind: each is tried alone (one route's write must not hide another's)."""
SWEPT = {
    "commondir": ".git/commondir",
    "rebase": ".git/rebase-merge",
    "module-commondir": ".git/modules/sub/commondir",
    "nested-commondir": "vendor/lib/.git/commondir",
}
"""Routes a writable ``.git`` leaves open in ``rw`` (a name created where there was none), and
what the sweep after the call moves into the data directory's quarantine (:mod:`sandbox.gitsweep`)."""
PRELUDE = 'p() { printf "#!/bin/sh\\ntouch %s/%s\\n" "$M" "$1" > "$2" && chmod +x "$2"; }; echo changed >> README.md; '


def host_uses(repo: Path, worktree: Path, *, planted: bool) -> None:
    """What the user does next on the host, in every repository the workspace holds."""
    assert git(repo, "status").returncode == 0
    git(repo, "log", "-p", "-1")
    git(repo, "diff")
    assert git(repo, "commit", "-qa", "--allow-empty", "-m", "after the jail").returncode == 0
    git(repo, "checkout", "-q", "-b", "other", check=False)
    git(repo, "checkout", "-q", "main", check=False)
    git(repo, "fetch", "-q", "origin", check=False)
    git(repo, "rebase", "--continue", check=False)  # what `git status` suggests when a rebase is in progress
    nested = [repo / "sub", repo / "vendor" / "lib", worktree, *([repo / "planted"] if planted else [])]
    for where in nested:
        git(where, "status", check=False)
        git(where, "diff", check=False)
        git(where, "commit", "-q", "--allow-empty", "-m", "after", check=False)
        git(where, "checkout", "-q", "-b", "elsewhere", check=False)


async def plant(open_jail: JailFactory, markers: Path, mode: str, route: str) -> None:
    """Run a planting route in a jail; in copy/overlay, apply the way a user does (no consent)."""
    jail = await open_jail(mode_profile(mode))
    script = f'M={markers}; W="$PWD"; {PRELUDE}{route} echo planted'
    result = await executor.run(jail, ["bash", "-c", script])
    assert result.stdout.endswith("planted\n"), result.stderr
    changes = await jail.changes()
    if mode in ("copy", "overlay"):
        assert changes is not None
        report = await jail.apply(changes)
        assert report.held_back, "the planted routes must be flagged"
    await jail.aclose()


@pytest.mark.parametrize("route", ROUTES)
async def test_host_git_runs_nothing_the_jail_planted(
    open_jail: JailFactory, repo: Path, tmp_path: Path, mode: str, route: str
) -> None:
    markers = tmp_path / "markers"
    await plant(open_jail, markers, mode, ROUTES[route])
    # In rw a repository planted inside the workspace stays on the host, but what git would run in it
    # (hooks, a config beyond what git init and clone write) is quarantined once the call is over; copy
    # and overlay hold it back, ro never had it. The user then enters it: nothing runs.
    planted = (repo / "planted" / ".git").exists()
    assert mode == "rw" or not planted
    host_uses(repo, tmp_path / "wt", planted=True)
    assert sorted(os.listdir(markers)) == []
    assert not (repo / ".git" / "objects" / "info" / "alternates").exists()


@pytest.mark.parametrize("route", SWEPT)
async def test_rw_what_a_call_leaves_in_a_git_directory_is_quarantined(
    open_jail: JailFactory, repo: Path, tmp_path: Path, data_dir: Path, route: str
) -> None:
    """A writable ``.git`` takes a new ``commondir`` or rebase todo: moved away once the call is
    over, said in the result (and by Bash), kept in the data directory, obeyed by no host git."""
    markers = tmp_path / "markers"
    jail = await open_jail(mode_profile("rw"))
    script = f'M={markers}; W="$PWD"; {PRELUDE}{ROUTES[route]} echo planted'
    result = await executor.run(jail, ["bash", "-c", script])
    assert result.stdout.endswith("planted\n"), result.stderr
    rel, moved = SWEPT[route], result.quarantined or []
    assert [q["path"] for q in moved] == [rel]
    kept = Path(moved[0]["moved_to"])
    assert kept.is_relative_to(data_dir / gitsweep.QUARANTINE) and kept.as_posix().endswith(rel)
    assert oct((data_dir / gitsweep.QUARANTINE).stat().st_mode & 0o777) == oct(0o700)
    assert not os.path.lexists(repo / rel)
    bash = await run_bash(jail, BashParams(command=f"{script} >/dev/null"), env={})
    assert rel in bash.content and "quarantined" in bash.content, bash.content
    assert [q["path"] for q in bash.details["quarantined"]] == [rel]
    await jail.aclose()
    host_uses(repo, tmp_path / "wt", planted=False)
    assert sorted(os.listdir(markers)) == []


async def test_rw_git_work_done_within_a_call_is_left_alone(open_jail: JailFactory, repo: Path) -> None:
    """A commit, and a rebase started and finished in one call, leave nothing to quarantine."""
    jail = await open_jail(mode_profile("rw"))
    g = "git -c user.name=J -c user.email=j@x"
    script = (
        f"set -e; echo more >> README.md; {g} commit -qam work; git checkout -q -b topic; "
        f"{g} commit -q --allow-empty -m topic; git checkout -q main; {g} commit -q --allow-empty -m main; "
        f"git checkout -q topic; {g} rebase -q main; git checkout -q main; echo done"
    )
    result = await executor.run(jail, ["bash", "-c", script])
    assert result.stdout.endswith("done\n"), result.stderr
    assert result.quarantined is None
    await jail.aclose()
    assert git(repo, "log", "-1", "--format=%s", "topic").stdout == "topic\n"
    assert git(repo, "log", "-1", "--format=%s", "main~1").stdout == "work\n"
    assert git(repo, "log", "-1", "--format=%s", "topic~1").stdout == "main\n"


async def test_rw_the_users_own_git_state_stays_until_a_call_changes_it(
    open_jail: JailFactory, repo: Path, backend: base.Backend
) -> None:
    """A cherry-pick the user has in progress on the host is not the jail's: it stays while no call
    changes it; an ``exec`` line a call adds to its todo moves it to the quarantine."""
    todo = repo / ".git" / "sequencer" / "todo"
    todo.parent.mkdir()
    todo.write_text("pick 0000000 x\n")
    own_like_a_checkout(repo, backend.name)
    jail = await open_jail(mode_profile("rw"))
    quiet = await executor.run(jail, ["bash", "-c", "cat .git/sequencer/todo >/dev/null && git status -s >/dev/null"])
    assert quiet.exit_code == 0 and quiet.quarantined is None, quiet.stderr
    assert todo.read_text() == "pick 0000000 x\n"
    edit = await executor.run(jail, ["bash", "-c", "echo 'exec touch /tmp/x' >> .git/sequencer/todo"])
    assert [q["path"] for q in edit.quarantined or []] == [".git/sequencer"], edit.stderr
    assert not todo.parent.exists()
    await jail.aclose()


async def test_a_linked_worktree_keeps_its_gitdir_pointer(
    open_jail: JailFactory, tmp_path: Path, backend: base.Backend, writable_mode: str
) -> None:
    """A workspace that is a linked worktree: its ``.git`` file names the git directory git obeys."""
    markers, main, linked = tmp_path / "markers", tmp_path / "main", tmp_path / "linked"
    markers.mkdir()
    git(tmp_path, "init", "-q", "-b", "main", "main")
    (main / "README.md").write_text("# sample\n")
    git(main, "add", "-A")
    git(main, "commit", "-q", "-m", "first")
    git(main, "worktree", "add", "-q", "-b", "feature", str(linked))
    own_like_a_checkout(linked, backend.name)
    jail = await open_jail(mode_profile(writable_mode), linked)
    script = f'M={markers}; {PRELUDE}{evil_gitdir("evil.git")} echo "gitdir: $PWD/evil.git" > .git; echo planted'
    result = await executor.run(jail, ["bash", "-c", script])
    assert result.stdout.endswith("planted\n"), result.stderr
    changes = await jail.changes()
    if changes is not None:
        assert (await jail.apply(changes)).held_back
    await jail.aclose()
    for args in (["status"], ["diff"], ["commit", "-qam", "after"], ["checkout", "-q", "-b", "next"]):
        git(linked, *args, check=False)
    assert sorted(os.listdir(markers)) == []


async def test_a_file_a_host_tool_runs_on_its_own_stays_as_it_was(
    open_jail: JailFactory, workspace: Path, tmp_path: Path, writable_mode: str
) -> None:
    """mise runs a trusted directory's ``[hooks]`` at the next prompt (trust is by path): its
    config is sealed in rw and held back in copy/overlay, repository or not."""
    (workspace / "mise.toml").write_text('[tools]\npython = "3.12"\n')
    os.chown(workspace / "mise.toml", *_owner(workspace))
    jail = await open_jail(mode_profile(writable_mode))
    script = f"printf '[hooks]\\nenter = \"touch {tmp_path}/mise\"\\n' > mise.toml; echo done"
    result = await executor.run(jail, ["bash", "-c", script])
    assert result.stdout.endswith("done\n"), result.stderr
    changes = await jail.changes()
    if changes is not None:
        assert [h["path"] for h in (await jail.apply(changes)).held_back] == ["mise.toml"]
    assert (workspace / "mise.toml").read_text() == '[tools]\npython = "3.12"\n'


def _owner(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_uid, st.st_gid


async def test_rw_a_repository_one_call_made_is_sealed_for_the_next(open_jail: JailFactory, workspace: Path) -> None:
    """The search before each call (seal.Watch) finds a new nested repository: from the next call
    on, its config and hooks are read-only like any other's (the call that made it could write them)."""
    git(workspace, "init", "-q")
    jail = await open_jail(mode_profile("rw"))
    made = await executor.run(jail, ["bash", "-c", "git init -q planted && echo made"])
    assert made.stdout == "made\n", made.stderr
    script = "echo x > planted/.git/hooks/pre-commit; echo hook=$?; echo '[core]' >> planted/.git/config; echo cfg=$?"
    result = await executor.run(jail, ["bash", "-c", script])
    assert result.stdout == "hook=1\ncfg=1\n", result.stderr
    assert not (workspace / "planted" / ".git" / "hooks" / "pre-commit").exists()


async def test_rw_a_session_says_what_it_quarantined_and_audits_it(repo: Path, backend: base.Backend) -> None:
    """Through the Bash tool: the result's text and details name it, and so does the audit record."""
    box = await Sandbox.create(repo, profile=mode_profile("rw", backend=backend.name), mode="auto")
    try:
        result = await box.call("Bash", {"command": 'echo "$PWD/elsewhere" > .git/commondir; echo done'})
        rows = box.audit.rows()
    finally:
        await box.aclose()
    assert result.ok, result.content
    assert "quarantined" in result.content and ".git/commondir" in result.content, result.content
    assert [q["path"] for q in result.details["quarantined"]] == [".git/commondir"]
    assert [json.loads(r["quarantined"])[0]["path"] for r in rows if r["quarantined"]] == [".git/commondir"]
    assert not (repo / ".git" / "commondir").exists()


@pytest.mark.bwrap
def test_rw_sandbox_run_sweeps_on_both_paths(workspace: Path, data_dir: Path) -> None:
    """``sandbox run --mount rw``: the full path (the first run), then the quick path (:mod:`sandbox.cli.launch`)."""
    backend_or_skip("bwrap")
    git(workspace, "init", "-q")
    plant = ("run", "--backend", "bwrap", "--mount", "rw", "--workspace", str(workspace), "--")
    for _ in ("full", "quick"):
        ran = sandbox(*plant, "sh", "-c", 'echo "$PWD/elsewhere" > .git/commondir')
        assert ran.returncode == 0, ran.stderr
        assert b"quarantined" in ran.stderr and b".git/commondir" in ran.stderr, ran.stderr
        assert not (workspace / ".git" / "commondir").exists()
    assert len(list((data_dir / gitsweep.QUARANTINE).glob("*/.git/commondir"))) == 2


async def test_rw_a_repository_a_call_creates_keeps_what_git_init_and_clone_write(
    open_jail: JailFactory, repo: Path
) -> None:
    """An honest ``git clone`` or ``git init`` inside the workspace is left whole; only what would
    run on the host (a hook, a config key beyond init's, clone's and an identity) is quarantined."""
    jail = await open_jail(mode_profile("rw"))
    script = (
        f"set -e; git clone -q {repo}/.git cloned; git init -q made; cd made; git config user.name J; "
        "git config user.email j@x; echo x > f; git add f; git commit -qm one; echo done"
    )
    result = await executor.run(jail, ["bash", "-c", script])
    assert result.stdout == "done\n", result.stderr
    assert not result.quarantined, result.quarantined
    assert (repo / "cloned" / ".git" / "config").exists() and (repo / "made" / ".git" / "config").exists()
    assert git(repo / "made", "log", "--oneline").stdout.strip().endswith("one")
    await jail.aclose()
