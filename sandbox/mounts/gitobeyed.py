"""What the host's git obeys in a workspace: the paths a jail must not change behind its back.

git runs programs a repository names (hooks, ``core.fsmonitor``, filters: see
:data:`sandbox.mounts.gitreview.RISKY_KEYS`) and reads configuration from where it points
(``commondir``, alternates, included files), and hook managers run commands from worktree files.
:func:`obeyed` lists those paths for the workspace's repositories, read as plain files from the
host (:mod:`sandbox.mounts.gitfiles`, :mod:`sandbox.mounts.gitconfig`), never with git: ``rw``
seals them read-only (:mod:`sandbox.backends.seal`), :mod:`sandbox.gitsweep` looks in the git
directories, and a change to a worktree path git obeys is flagged like a hook
(:func:`obeyed_in_worktree`). Apart from :mod:`sandbox.mounts.gitreview` because it reads the
host's repository as it stands, before any jail, where the review reads a changeset.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sandbox.mounts.gitconfig import ConfigError, parse_config
from sandbox.mounts.gitfiles import READ_MAX, host_files, read_file
from sandbox.mounts.gitreview import GIT, is_repository

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

GITDIR_OBEYED = ("config", "config.worktree", "commondir", "hooks", "info", "objects/info", "worktrees")
"""Inside a git directory: what names a program for git to run (config, hooks, attributes that
select drivers) or points git elsewhere (``commondir``, alternates in ``objects/info``, linked
worktrees' ``gitdir``/``commondir``). The rest (objects, refs, logs, the index) is data."""
GITDIR_MADE = frozenset({"hooks", "info", "objects/info"})
"""Of those, what ``git init`` makes: made when missing, so that it can be sealed (see seal.py)."""
HOOK_MANAGERS = frozenset(
    {
        ".husky", ".lefthook", ".lefthook-local", ".config/lefthook.yml", ".config/lefthook.yaml",
        "lefthook.yml", "lefthook.yaml", "lefthook.json", "lefthook.toml", ".lefthook.yml", ".lefthook.yaml",
        "lefthook-local.yml", "lefthook-local.yaml", ".lefthook-local.yml", ".lefthook-local.yaml",
        ".pre-commit-config.yaml", ".pre-commit-config.yml", ".gitmodules",
    }
)  # fmt: skip
"""Worktree paths whose content an installed hook runs (husky's ``.husky/<hook>``, lefthook's and
pre-commit's ``run:``/``entry:`` commands), and ``.gitmodules`` (the URLs ``submodule update`` fetches)."""
HOST_TOOL_FILES = frozenset(
    {
        "mise.toml", "mise.local.toml", ".mise.toml", ".mise.local.toml", ".config/mise.toml",
        ".config/mise/config.toml", ".mise/config.toml",
    }
)  # fmt: skip
"""Not git's, listed here with git's because they are sealed and flagged alike: files a host tool
runs commands from on its own, unasked (mise runs a trusted directory's hooks and env scripts at
every prompt, and trusts a path, not its content). direnv's ``.envrc`` is trusted by content (a
changed file waits for ``direnv allow``) and is a dotfile; see docs/threat-model.md for the rest."""


@dataclass(frozen=True)
class Obeyed:
    """A repository's workspace-relative paths the host's git (or a hook manager) obeys."""

    gitdirs: tuple[str, ...]  # git directories: .git and the submodules' under .git/modules
    protected: tuple[str, ...]  # present entries of GITDIR_OBEYED, hook dirs, managers, gitdir files
    missing: tuple[str, ...]  # directories git would obey that do not exist yet (made, then sealed)
    missing_files: tuple[str, ...] = ()  # files likewise: config.worktree where read, included files


def obeyed(workspace: Path, nested: Iterable[str] = ()) -> Obeyed:
    """What the repositories of ``workspace`` obey, read as files from the host, and the
    :data:`HOST_TOOL_FILES` present.

    The repositories: the workspace's own and those ``nested`` (workspace-relative directories
    holding a ``.git``). A ``.git`` *file* (a linked worktree's or a submodule's checkout) is itself
    what git obeys: it names the git directory. ``core.hooksPath`` and included files are read
    from each git directory's config and kept when they lead inside the workspace (outside it, the
    jail cannot write them); submodules' and linked worktrees' ``.git`` files are found from git's
    own records (the submodules' git directories under ``.git/modules``, the worktrees' ``gitdir``
    files), not from ``.gitmodules``.
    """
    roots = [root for root in ("", *nested) if os.path.lexists(workspace / root / GIT)]
    files = [f"{root}/{GIT}".lstrip("/") for root in roots if os.path.isfile(workspace / root / GIT)]
    gitdirs = [gitdir for root in roots if is_repository(workspace / root) for gitdir in _git_dirs(workspace, root)]
    protected = [f"{r}/{n}".lstrip("/") for r in roots for n in HOOK_MANAGERS if os.path.lexists(workspace / r / n)]
    protected += files + [rel for rel in HOST_TOOL_FILES if os.path.lexists(workspace / rel)]
    missing: list[str] = []
    for gitdir in gitdirs:
        for name in GITDIR_OBEYED:
            rel = f"{gitdir}/{name}"
            if os.path.lexists(workspace / rel):
                protected.append(rel)
            elif name in GITDIR_MADE:
                missing.append(rel)
        hooks = hooks_dir(workspace, gitdir)
        if hooks is not None:
            (protected if os.path.lexists(workspace / hooks) else missing).append(hooks)
    absent = [f"{d}/config.worktree" for d in gitdirs if f"{d}/config.worktree" not in protected]
    absent = [rel for rel in absent if _reads_worktree_config(workspace, rel.removesuffix("/config.worktree"))]
    for target in (target for gitdir in gitdirs for target in includes(workspace, gitdir)):
        (protected if os.path.lexists(workspace / target) else absent).append(target)
    protected += _gitdir_files(workspace, gitdirs)
    return Obeyed(tuple(gitdirs), tuple(dict.fromkeys(protected)), tuple(dict.fromkeys(missing)), tuple(absent))


def git_dirs(workspace: Path, root: str = "") -> Iterator[str]:
    """``root``'s git directory, then its submodules' (what :mod:`sandbox.gitsweep` looks in)."""
    return _git_dirs(workspace, root)


def _git_dirs(workspace: Path, root: str) -> Iterator[str]:
    """``root``'s git directory, then its submodules' under ``.git/modules`` (names may hold ``/``; modules nest)."""
    yield f"{root}/{GIT}".lstrip("/")
    pending = [f"{root}/{GIT}/modules".lstrip("/")]
    while pending:
        rel = pending.pop()
        try:
            entries = sorted(os.scandir(workspace / rel), key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            if not entry.is_dir(follow_symlinks=False):
                continue
            child = f"{rel}/{entry.name}"
            if os.path.isfile(workspace / child / "HEAD"):
                yield child
                pending.append(f"{child}/modules")
            else:
                pending.append(child)  # a name with a "/": foo/bar


def hooks_dir(workspace: Path, gitdir: str = GIT) -> str | None:
    """``core.hooksPath`` of ``gitdir``'s config, workspace-relative, when it leads inside the
    workspace's worktree (``None`` when unset, outside, or the config is unreadable)."""
    values = _config(workspace, gitdir).get("core.hookspath")
    if not values:
        return None
    own = gitdir == GIT or gitdir.endswith(f"/{GIT}")  # a repository's own, not a submodule's under modules/
    top = workspace / gitdir.removesuffix(GIT) if own else _module_worktree(workspace, gitdir)
    return _inside(workspace, os.path.join(top, os.path.expanduser(values[-1])))


_INCLUDE_DEPTH = 10  # git's own limit on nested includes


def includes(workspace: Path, gitdir: str = GIT) -> list[str]:
    """The files inside the workspace that ``gitdir``'s config includes (``include.path``,
    ``includeIf.*.path``, whatever the condition), followed through those the host holds as git
    does: a relative path is relative to the including file."""
    found: list[str] = []
    pending = [(f"{gitdir}/config", 0)]
    while pending:
        rel, depth = pending.pop()
        for key, values in _config(workspace, rel, file=True).items():
            if key != "include.path" and not (key.startswith("includeif.") and key.endswith(".path")):
                continue
            for value in values:
                target = _inside(workspace, os.path.join(workspace / rel, "..", os.path.expanduser(value)))
                if target is not None and target not in found:
                    found.append(target)
                    if depth < _INCLUDE_DEPTH:
                        pending.append((target, depth + 1))
    return found


def _inside(workspace: Path, path: str) -> str | None:
    """``path`` (absolute), workspace-relative when it lies inside the workspace (the root excluded)."""
    inside = os.path.relpath(os.path.normpath(path), workspace)
    return None if inside == "." or inside.startswith("..") or os.path.isabs(inside) else inside.replace(os.sep, "/")


def _module_worktree(workspace: Path, gitdir: str) -> Path:
    """A submodule's worktree: its config's ``core.worktree`` (relative to the git directory)."""
    values = _config(workspace, gitdir).get("core.worktree")
    return Path(os.path.normpath(workspace / gitdir / values[-1])) if values else workspace


def _config(workspace: Path, rel: str, *, file: bool = False) -> dict[str, list[str]]:
    """The config of git directory ``rel`` (or the config file ``rel``) as the host holds it; empty
    when missing or not understood (a config this parser cannot read is the host user's own:
    sealed whole in rw, and read by git, not by us)."""
    try:
        return parse_config(read_file(workspace / rel if file else workspace / rel / "config", READ_MAX) or b"")
    except ConfigError:
        return {}


def _reads_worktree_config(workspace: Path, gitdir: str) -> bool:
    values = _config(workspace, gitdir).get("extensions.worktreeconfig") or ["false"]
    return values[-1].lower() in ("true", "yes", "on", "1")


def _gitdir_files(workspace: Path, gitdirs: Iterable[str]) -> Iterator[str]:
    """The ``.git`` files inside the workspace that point at one of ``gitdirs`` or its worktrees."""
    for gitdir in gitdirs:
        if not (gitdir == GIT or gitdir.endswith(f"/{GIT}")):
            found = _module_worktree(workspace, gitdir) / GIT
            if found.is_relative_to(workspace) and os.path.isfile(found):
                yield found.relative_to(workspace).as_posix()
        for record in host_files(workspace, f"{gitdir}/worktrees"):
            if record.count("/") == gitdir.count("/") + 2 and record.endswith("/gitdir"):
                pointed = Path((read_file(workspace / record, 4096) or b"").decode("utf-8", "replace").strip())
                if pointed.is_relative_to(workspace) and os.path.isfile(pointed):
                    yield pointed.relative_to(workspace).as_posix()


def obeyed_in_worktree(workspace: Path, rel: str) -> bool:
    """Whether worktree path ``rel`` is a hook manager's file, under the host's ``core.hooksPath``
    or a file the host's config includes."""
    if any(rel == name or rel.startswith(f"{name}/") for name in HOOK_MANAGERS):
        return True
    hooks, included = _root_config_paths(workspace)
    return rel in included or (hooks is not None and (rel == hooks or rel.startswith(f"{hooks}/")))


def _root_config_paths(workspace: Path) -> tuple[str | None, tuple[str, ...]]:
    # Asked once per change of a changeset: the config is read again only when it changed.
    try:
        st = os.stat(workspace / GIT / "config")
    except OSError:
        return None, ()
    return _root_config_paths_of(workspace, st.st_ino, st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _root_config_paths_of(workspace: Path, _ino: int, _size: int, _mtime: int) -> tuple[str | None, tuple[str, ...]]:
    return hooks_dir(workspace), tuple(includes(workspace))
