"""What a jail sees of the developer's environment, per backend: passed-through variables,
read-only host files in the jail's home (the git identity), the workspace's tool directories on
PATH. Each feature is shown working with its profile line and absent without it; the refusals
(secrets, paths outside ``~``) and the read-only binding are tested by attack.
"""

from __future__ import annotations

import os
import subprocess
import textwrap
from typing import TYPE_CHECKING, Any

import pytest

from sandbox import exec as executor
from sandbox import profile as profiles
from sandbox.backends.environment import base_env
from sandbox.envrules import SANDBOX_HOME
from sandbox.errors import InvalidArgument
from tests.conftest import JailFactory, backend_or_skip, make_profile

if TYPE_CHECKING:
    from pathlib import Path

    from sandbox.backends import base

pytestmark = pytest.mark.anyio

GIT_IDENTITY = "[user]\n\tname = Jail Tester\n\temail = jail@example.test\n"
COMMIT = "git init -q . && git commit -q --allow-empty -m first && git log -1 --format='%an <%ae>'"


async def sh(jail: base.Jail, script: str, **kw: Any) -> executor.ExecResult:
    return await executor.run(jail, ["/bin/sh", "-c", script], **kw)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The caller's home on the host side (what ``~`` means in a profile), with a git identity."""
    path = tmp_path / "caller-home"
    path.mkdir()
    (path / ".gitconfig").write_text(GIT_IDENTITY)
    monkeypatch.setenv("HOME", str(path))
    for name in ("GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL", "EMAIL"):
        monkeypatch.delenv(name, raising=False)
    return path


def _profile(backend: base.Backend, **overrides: Any) -> profiles.Profile:
    return make_profile(backend=backend.name, **overrides)


# --- the git identity: a host file, read-only, in the jail's home ----------------------------


@pytest.mark.usefixtures("home")
async def test_git_commit_fails_without_the_identity(open_jail: JailFactory, backend: base.Backend) -> None:
    jail = await open_jail(_profile(backend))
    result = await sh(jail, COMMIT)
    assert result.exit_code != 0 and "Author identity unknown" in result.stderr, result


@pytest.mark.usefixtures("home")
async def test_git_commit_works_with_gitconfig_shared(open_jail: JailFactory, backend: base.Backend) -> None:
    jail = await open_jail(_profile(backend, **{"env.files": ["~/.gitconfig"]}))
    result = await sh(jail, COMMIT)
    assert (result.exit_code, result.stdout) == (0, "Jail Tester <jail@example.test>\n"), result


async def test_shared_file_is_read_only_and_home_stays_writable(
    open_jail: JailFactory, backend: base.Backend, home: Path
) -> None:
    (home / ".config" / "tool").mkdir(parents=True)
    (home / ".config" / "tool" / "conf").write_text("deep\n")
    jail = await open_jail(_profile(backend, **{"env.files": ["~/.gitconfig", "~/.config/tool/conf"]}))
    result = await sh(
        jail,
        'cat ~/.config/tool/conf; echo "[core]" >> ~/.gitconfig && echo WROTE; '
        "rm -f ~/.gitconfig && echo REMOVED; echo ok > ~/scratch && cat ~/scratch; "
        'echo "HOME=$HOME"',
    )
    assert "deep\n" in result.stdout and "ok\n" in result.stdout, result
    assert "WROTE" not in result.stdout and "REMOVED" not in result.stdout, result
    assert f"HOME={SANDBOX_HOME}" in result.stdout
    assert (home / ".gitconfig").read_text() == GIT_IDENTITY


@pytest.mark.usefixtures("home")
async def test_missing_host_file_is_skipped(open_jail: JailFactory, backend: base.Backend) -> None:
    jail = await open_jail(_profile(backend, **{"env.files": ["~/.gitconfig", "~/.not-here"]}))
    result = await sh(jail, "test -e ~/.not-here && echo PRESENT; cat ~/.gitconfig")
    assert result.exit_code == 0 and "PRESENT" not in result.stdout and "Jail Tester" in result.stdout, result


def _link_gitconfig_to_a_key(home: Path) -> None:
    (home / ".ssh").mkdir()
    (home / ".ssh" / "id_ed25519").write_text("PRIVATE KEY\n")
    (home / ".gitconfig").unlink()
    (home / ".gitconfig").symlink_to(home / ".ssh" / "id_ed25519")


def test_link_into_a_secret_is_refused_when_the_profile_loads(home: Path) -> None:
    _link_gitconfig_to_a_key(home)
    with pytest.raises(InvalidArgument, match=r"env\.files.*resolves to .*/\.ssh/id_ed25519, a secret"):
        make_profile("default", **{"env.files": ["~/.gitconfig"]})


async def test_link_made_after_loading_is_refused_when_the_jail_opens(
    open_jail: JailFactory, backend: base.Backend, home: Path
) -> None:
    profile = _profile(backend, **{"env.files": ["~/.gitconfig"]})
    _link_gitconfig_to_a_key(home)
    with pytest.raises(InvalidArgument, match=r"\.ssh") as info:
        await open_jail(profile)
    assert info.value.data["file"] == "~/.gitconfig"


async def test_a_directory_is_refused(open_jail: JailFactory, backend: base.Backend, home: Path) -> None:
    (home / ".config" / "git").mkdir(parents=True)
    with pytest.raises(InvalidArgument, match="not a regular file"):
        await open_jail(_profile(backend, **{"env.files": ["~/.config/git"]}))


@pytest.mark.parametrize(
    "entry",
    [
        "~/.ssh/id_rsa",
        "~/.ssh",
        "~/.aws/credentials",
        "~/.netrc",
        "~/.git-credentials",
        "~/.config/gcloud/credentials.db",
        "~/work/server.pem",
        "~/.docker/config.json",
        "~/.local/share/sandbox/audit.sqlite",
    ],
)
def test_secret_paths_are_refused_when_the_profile_loads(entry: str) -> None:
    with pytest.raises(InvalidArgument, match=r"env\.files.*secret"):
        make_profile("default", **{"env.files": [entry]})


@pytest.mark.parametrize("entry", ["/etc/shadow", ".gitconfig", "~", "~/../etc/passwd", "~/a/../../b", "~other/x"])
def test_paths_outside_home_are_refused(entry: str) -> None:
    with pytest.raises(InvalidArgument, match=r"env\.files.*(name a file of your home as ~/|without '\.\.')"):
        make_profile("default", **{"env.files": [entry]})


# --- the pass-through list -------------------------------------------------------------------


async def test_allow_passes_git_identity_variables(
    open_jail: JailFactory, backend: base.Backend, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (home / ".gitconfig").unlink()
    names = ("GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL")
    for name in names:
        monkeypatch.setenv(name, "Env Tester" if name.endswith("NAME") else "env@example.test")
    monkeypatch.setenv("SANDBOX_TEST_SECRET", "s3cret")
    without = await sh(await open_jail(_profile(backend)), COMMIT + "; rc=$?; env; exit $rc")
    assert without.exit_code != 0 and "Author identity unknown" in without.stderr, without
    assert "Env Tester" not in without.stdout
    jail = await open_jail(_profile(backend, **{"env.allow": list(names)}), ws=_fresh(home, backend))
    result = await sh(jail, COMMIT + "; rc=$?; env; exit $rc")
    assert result.exit_code == 0 and result.stdout.startswith("Env Tester <env@example.test>\n"), result
    assert "s3cret" not in result.stdout


@pytest.mark.parametrize("name", ["PATH", "HOME", "1BAD", "A=B", ""])
def test_allow_refuses_names_the_jail_fixes_or_that_are_not_names(name: str) -> None:
    with pytest.raises(InvalidArgument, match=r"env\.allow.*(not an environment variable name|set by the jail)"):
        make_profile("default", **{"env.allow": [name]})


# --- the workspace's tool directories on PATH ------------------------------------------------


def _venv_with_console_script(workspace: Path) -> None:
    """A real venv made by Debian's python (visible in every jail) with a pip-style console script."""
    venv = workspace / ".venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "hellotool.py").write_text("import sys\n\ndef main():\n    print('venv-tool', sys.prefix)\n")
    script = venv / "bin" / "hello-tool"
    script.write_text(
        textwrap.dedent(f"""\
        #!{venv}/bin/python
        import sys
        from hellotool import main
        sys.exit(main())
        """)
    )
    script.chmod(0o755)


def _node_bin(workspace: Path) -> None:
    bin_dir = workspace / "node_modules" / ".bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "hello-node").write_text("#!/bin/sh\necho node-bin-ok\n")
    (bin_dir / "hello-node").chmod(0o755)


async def test_workspace_tools_are_on_path(open_jail: JailFactory, backend: base.Backend, workspace: Path) -> None:
    _venv_with_console_script(workspace)
    _node_bin(workspace)
    jail = await open_jail(_profile(backend))
    result = await sh(jail, "hello-tool && hello-node && command -v python")
    assert result.exit_code == 0, result
    assert result.stdout == f"venv-tool {workspace}/.venv\nnode-bin-ok\n{workspace}/.venv/bin/python\n"


async def test_workspace_path_can_be_turned_off(open_jail: JailFactory, backend: base.Backend, workspace: Path) -> None:
    _venv_with_console_script(workspace)
    _node_bin(workspace)
    jail = await open_jail(_profile(backend, **{"env.workspace_path": []}))
    result = await sh(jail, "hello-tool; echo rc=$?; hello-node; echo rc=$?")
    assert "rc=127\nrc=127\n" in result.stdout, result


def test_path_prepends_only_directories_that_exist(tmp_path: Path) -> None:
    (tmp_path / "node_modules" / ".bin").mkdir(parents=True)
    path = base_env(make_profile(), workspace=tmp_path)["PATH"].split(":")
    assert path[0] == f"{tmp_path}/node_modules/.bin" and f"{tmp_path}/.venv/bin" not in path
    assert base_env(make_profile())["PATH"] == base_env(make_profile(), workspace=tmp_path / "none")["PATH"]


@pytest.mark.parametrize("entry", ["/usr/bin", "../bin", "a/../../b", ""])
def test_workspace_path_entries_stay_inside_the_workspace(entry: str) -> None:
    with pytest.raises(InvalidArgument, match=r"env\.workspace_path.*relative to the workspace, inside it"):
        make_profile("default", **{"env.workspace_path": [entry]})


def _fresh(home: Path, backend: base.Backend) -> Path:
    ws = home.parent / "ws2"
    ws.mkdir()
    if os.geteuid() == 0 and backend.name == "docker":
        os.chown(ws, 1000, 1000)  # as the workspace fixture does for Docker: a developer's checkout
    return ws


@pytest.mark.docker
async def test_git_identity_in_a_per_call_container(home: Path) -> None:
    docker = backend_or_skip("docker")
    profile = _profile(docker, **{"env.files": ["~/.gitconfig"], "docker.lifecycle": "call"})
    async with await docker.open_jail(_fresh(home, docker), profile) as jail:
        result = await sh(jail, COMMIT + " && touch ~/written && echo home-writable")
    assert result.exit_code == 0 and result.stdout.endswith("home-writable\n"), result


async def test_refusal_leaves_no_copy_behind(
    open_jail: JailFactory, backend: base.Backend, home: Path, data_dir: Path
) -> None:
    profile = _profile(backend, **{"env.files": ["~/.gitconfig"], "mount.strategy": "copy"})
    _link_gitconfig_to_a_key(home)
    with pytest.raises(InvalidArgument, match="a secret"):
        await open_jail(profile)
    left = list((data_dir / "copies").glob("*")) if (data_dir / "copies").exists() else []
    assert left == [], left
