"""Git-aware review: a changeset's ``.git`` internals summarised, not listed file by file.

After ``git commit`` in a ``copy`` run the changeset is a heap of ``.git/objects/xx/…`` files
nobody can review. When the workspace is a git repository (its ``.git`` is a real directory on the
host), :func:`summarise` reads the repository before (the host) and after (the host overlaid with
the changeset's kept files, exactly what an apply would leave) and says what happened: new
commits per branch (id, subject, author), refs moved / created / deleted, ``HEAD``, the index
(and how many paths differ), ``packed-refs``; and what is risky: configuration keys that make git
run a command or read configuration from elsewhere (:data:`RISKY_KEYS`, added, changed or
removed), new or changed hooks, ``.git`` entries that are none of git's own data files, and a
``.gitmodules`` in the worktree.

**Nothing here runs git, and nothing the jail wrote is ever executed or followed.** The private
copy's ``.git`` was written by an untrusted command, and git itself would obey it: a
``core.fsmonitor`` runs on ``git status``, a ``filter`` on ``git add``, a hook on ``checkout``.
So everything is read as plain files, from the kept copy (our own 0600 files, not the jail's):
refs, ``HEAD`` and ``packed-refs`` as text; ``config`` by a small strict parser of the keys'
syntax (``include.path`` / ``includeIf`` are reported, never followed; a file it does not fully
understand is itself risky, since a parser that disagrees with git could hide a key); commit
objects by zlib from loose objects, capped in size. Commits that arrive in a pack are counted as
"packed, not summarised" rather than read with git. Every string shown comes from the jail and
is escaped (no terminal control sequences).

Consent (:mod:`sandbox.changes`): the ``.git`` entries form one group, ``git``, applied as a unit.
Naming ``.git`` or any entry under it selects the whole group; without consent the group is held
back whole when :attr:`GitSummary.risky` is not empty, and otherwise applied with the rest.
"""

from __future__ import annotations

import fnmatch
import functools
import os
import re
import stat
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

    from sandbox.mounts.changeset import Change

GIT = ".git"
GROUP = "git"
"""The consent group the ``.git`` entries form."""

RISKY_KEYS: dict[str, str] = {
    "core.hookspath": "runs hooks from another directory",
    "core.fsmonitor": "a command most git commands run (status, diff, commit)",
    "core.sshcommand": "a command run on fetch and push",
    "core.gitproxy": "a command run on fetch",
    "core.pager": "a command run on any paged output",
    "pager.*": "a command run on that command's output",
    "core.editor": "a command run on commit, rebase, tag",
    "sequence.editor": "a command run on rebase -i",
    "core.askpass": "a command run when git needs a password",
    "core.worktree": "points git at another directory",
    "core.alternaterefscommand": "a command run on fetch and push",
    "diff.external": "a command run by diff and log -p",
    "diff.*.command": "a command run by diff",
    "diff.*.textconv": "a command run by diff, log -p, blame",
    "interactive.difffilter": "a command run by add -p",
    "filter.*": "clean/smudge/process commands run on add, checkout, status",
    "merge.*.driver": "a command run on merge",
    "difftool.*.cmd": "a command run by difftool",
    "mergetool.*.cmd": "a command run by mergetool",
    "credential.*": "a helper that is run and handed secrets",
    "url.*.insteadof": "rewrites remote URLs (to ext:: commands, or elsewhere)",
    "url.*.pushinsteadof": "rewrites push URLs",
    "protocol.*.allow": "enables transports such as ext::, which run commands",
    "remote.*.uploadpack": "a command run on fetch",
    "remote.*.receivepack": "a command run on push",
    "submodule.*.update": "'!command' runs a command on submodule update",
    "include.path": "reads configuration from another file (not followed here)",
    "includeif.*": "reads configuration from another file (not followed here)",
    "alias.*": "'!command' aliases run a command when typed",
    "gpg.program": "a command run to sign or verify",
    "gpg.*.program": "a command run to sign or verify",
    "extensions.*": "changes how git reads the repository (worktreeConfig reads another config)",
    "uploadpack.packobjectshook": "a command run on fetch from this repository",
    "web.browser": "a command run by help and instaweb",
    "browser.*.cmd": "a command run by help and instaweb",
    "man.*.cmd": "a command run by help",
}
"""Configuration keys (lower case, ``*`` for a subsection) that make git run a command, read
configuration from elsewhere or send data elsewhere: the brief's list plus the other keys of
git-config(1) that name a command (remote.*.uploadpack, gpg.program, submodule.*.update…)."""

# git's own data files: changing these cannot make git run anything (a first component, or a path).
# Not among them: ``rebase-merge`` (its todo's ``exec`` lines run on ``rebase --continue``) and
# ``sequencer`` (its ``opts`` is a config file naming a merge strategy).
_DATA = frozenset(
    {
        "objects", "refs", "logs", "branches", "rebase-apply", "lost-found",
        "HEAD", "ORIG_HEAD", "FETCH_HEAD", "MERGE_HEAD", "MERGE_MSG", "MERGE_MODE", "CHERRY_PICK_HEAD",
        "REVERT_HEAD", "AUTO_MERGE", "BISECT_LOG", "COMMIT_EDITMSG", "TAG_EDITMSG", "index", "packed-refs",
        "description", "shallow", "gc.pid", "gc.log", "info", "hooks",
    }
)  # fmt: skip
_NOT_DATA = frozenset({("objects", "info", "alternates"), ("objects", "info", "http-alternates")})
_INFO_DATA = frozenset({"exclude", "refs"})
_OBJECT = re.compile(r"^\.git/objects/([0-9a-f]{2})/([0-9a-f]{38}|[0-9a-f]{62})$")
_ID = re.compile(rb"^[0-9a-f]{40}$|^[0-9a-f]{64}$")
_READ_MAX = 1 << 20  # a ref, config or compressed commit larger than this is not read
_LARGE_MAX = 1 << 26  # the index and packed-refs of a large repository
_COMMIT_MAX = 1 << 16  # of a commit object, only this much is inflated: headers and subject
_COMMITS_MAX = 100  # per ref
_SHOWN = 5  # commits listed per ref in text


def in_git(path: str) -> bool:
    return path == GIT or path.startswith(f"{GIT}/")


def is_repository(workspace: Path) -> bool:
    """The workspace's ``.git`` is a real directory (a ``.git`` file or symlink is not followed)."""
    try:
        return stat.S_ISDIR(os.lstat(workspace / GIT).st_mode)
    except OSError:
        return False


def internal_flags(rel: str) -> list[str]:
    """The flags of an entry under ``.git`` of a repository: ``git-hook``, ``git-config``, or
    ``dotfile`` for what is none of git's data files (``[]`` for those: the group covers them)."""
    parts = PurePosixPath(rel).parts[1:]
    if parts[:1] == ("hooks",) and len(parts) > 1:
        return [] if len(parts) == 2 and parts[1].endswith(".sample") else ["git-hook"]
    if parts == ("config",):
        return ["git-config"]
    if not parts or _is_data(parts):
        return []
    return ["dotfile"]


def _is_data(parts: tuple[str, ...]) -> bool:
    if parts[0] not in _DATA or parts in _NOT_DATA:
        return False
    return parts[0] != "info" or len(parts) == 1 or (len(parts) == 2 and parts[1] in _INFO_DATA)


# -- what the host's git obeys ------------------------------------------------------------------------

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
        return parse_config(_read(workspace / rel if file else workspace / rel / "config", _READ_MAX) or b"")
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
        for record in _host_files(workspace, f"{gitdir}/worktrees"):
            if record.count("/") == gitdir.count("/") + 2 and record.endswith("/gitdir"):
                pointed = Path((_read(workspace / record, 4096) or b"").decode("utf-8", "replace").strip())
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


# -- the summary ------------------------------------------------------------------------------------


@dataclass
class GitSummary:
    """What a changeset does to the repository; ``risky``: reasons to hold the git group back."""

    entries: int = 0
    head: list[str] | None = None  # [old, new] when HEAD changed
    refs: list[dict[str, Any]] = field(default_factory=list)  # ref, change, old, new, commits, packed
    index: dict[str, Any] | None = None  # changed, paths_differ (None when not counted)
    packed_refs: bool = False
    config: list[dict[str, Any]] = field(default_factory=list)  # key, change, old, new, risky, why
    hooks: list[dict[str, str]] = field(default_factory=list)  # path, status
    other: list[dict[str, Any]] = field(default_factory=list)  # path, status, flags
    gitmodules: str | None = None  # its status when the worktree's .gitmodules changed
    risky: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GitSummary:
        return cls(**data)

    def lines(self) -> list[str]:
        """The summary as review lines, ``git: …`` each."""
        found = [*_ref_lines(self.refs), *_state_lines(self), *_config_lines(self.config), *_risk_lines(self)]
        return [f"git: {line}" for line in found]


def summarise(workspace: Path, kept_tree: Path, changes: list[Change]) -> GitSummary | None:
    """The summary of ``changes`` (their content in ``kept_tree``) for a repository workspace.

    ``None`` when the workspace is no repository or nothing in or about git changed.
    """
    inside = [c for c in changes if in_git(c.path)]
    modules = next((c.status for c in changes if c.path == ".gitmodules"), None)
    if not is_repository(workspace) or not (inside or modules):
        return None
    old, new = _View(workspace), _View(workspace, kept_tree, inside)
    summary = GitSummary(entries=len(inside), gitmodules=modules)
    paths = {c.path: c for c in inside}
    try:
        _summarise_refs(summary, old, new, paths)
        _summarise_state(summary, old, new, paths)
        _summarise_config(summary, old, new, paths)
    except (OSError, ValueError) as exc:  # never lose the changeset over its summary: distrust it instead
        summary.risky.append(f"the repository could not be summarised: {exc}")
    _summarise_entries(summary, inside)
    return summary


def _summarise_refs(summary: GitSummary, old: _View, new: _View, paths: dict[str, Change]) -> None:
    before, after = old.refs(), new.refs()
    fresh = {m[1] + m[2] for p in paths if paths[p].status != "deleted" and (m := _OBJECT.match(p))}
    packs = any(p.startswith(".git/objects/pack/") and p.endswith(".pack") for p in paths)
    for ref in sorted(set(before) | set(after)):
        was, now = before.get(ref), after.get(ref)
        if was == now:
            continue
        item: dict[str, Any] = {"ref": ref, "change": _ref_change(was, now), "old": was, "new": now}
        if now is not None:
            item["commits"], item["packed"] = _new_commits(new, now, fresh, packs)
        summary.refs.append(item)


def _ref_change(was: str | None, now: str | None) -> str:
    return "created" if was is None else "deleted" if now is None else "moved"


def _new_commits(view: _View, tip: str, fresh: set[str], packs: bool) -> tuple[list[dict[str, str]], bool]:
    """The commits reachable from ``tip`` whose loose objects the changeset adds, newest first."""
    if tip not in fresh:
        return [], packs and not view.has_object(tip)
    found: list[dict[str, str]] = []
    queue, seen = [tip], {tip}
    while queue and len(found) < _COMMITS_MAX:
        commit = _read_commit(view, queue.pop(0))
        if commit is None:
            return found, True
        found.append(commit.shown())
        for parent in commit.parents:
            if parent in fresh and parent not in seen:
                seen.add(parent)
                queue.append(parent)
    return found, False


def _summarise_state(summary: GitSummary, old: _View, new: _View, paths: dict[str, Change]) -> None:
    if ".git/HEAD" in paths:
        was, now = _text(old.read(".git/HEAD")), _text(new.read(".git/HEAD"))
        summary.head = [was, now] if was != now else None
    if ".git/index" in paths:
        summary.index = {"changed": True, "paths_differ": _index_difference(old, new)}
    summary.packed_refs = ".git/packed-refs" in paths


def _summarise_config(summary: GitSummary, old: _View, new: _View, paths: dict[str, Change]) -> None:
    if ".git/config" not in paths:
        return
    try:
        before, after = parse_config(old.read(".git/config") or b""), parse_config(new.read(".git/config") or b"")
    except ConfigError as exc:
        summary.risky.append(f".git/config: {exc} (a config this parser cannot read is not trusted)")
        return
    for key in sorted(set(before) | set(after)):
        was, now = before.get(key), after.get(key)
        if was != now:
            summary.config.append(_config_item(key, was, now))
    summary.risky += [f"{c['key']} ({c['change']}): {c['why']}" for c in summary.config if c["risky"]]


def _config_item(key: str, was: list[str] | None, now: list[str] | None) -> dict[str, Any]:
    why = risky_key(key)
    change = "added" if was is None else "removed" if now is None else "changed"
    return {"key": key, "change": change, "old": was, "new": now, "risky": why is not None, "why": why or ""}


def risky_key(key: str) -> str | None:
    """Why ``key`` (as :func:`parse_config` names it) is risky; ``None`` when it is not."""
    lowered = key.lower()
    for pattern, why in RISKY_KEYS.items():
        if fnmatch.fnmatchcase(lowered, pattern):
            return why
    return None


def _summarise_entries(summary: GitSummary, inside: list[Change]) -> None:
    for change in inside:
        flags = [f for f in change.flags if f != "git-config"]
        if "git-hook" in flags:
            summary.hooks.append({"path": change.path, "status": change.status})
            if change.status != "deleted":
                summary.risky.append(f"hook {change.path} ({change.status})")
        elif flags:
            summary.other.append({"path": change.path, "status": change.status, "flags": flags})
            summary.risky.append(f"{change.path} ({change.status}) [{', '.join(flags)}]")
        elif not change.applicable:
            summary.risky.append(f"{change.path} is never applied: {change.reason}")


# -- reading the repository as files ------------------------------------------------------------------


class _View:
    """The repository as files: the host's, or the host's overlaid with the kept changes."""

    def __init__(self, workspace: Path, kept: Path | None = None, changes: Iterable[Change] = ()) -> None:
        self.workspace = workspace
        self.kept = kept
        self.changed = {c.path: c for c in changes}

    def read(self, rel: str, limit: int = _READ_MAX) -> bytes | None:
        change = self.changed.get(rel)
        if change is None:
            return _read(self.workspace / rel, limit)
        if self.kept is None or change.status == "deleted" or change.kind != "file":
            return None
        return _read(self.kept / rel, limit)

    def files(self, rel: str) -> set[str]:
        """The regular files below ``rel``."""
        found = set(_host_files(self.workspace, rel))
        for path, change in self.changed.items():
            if path.startswith(f"{rel}/"):
                present = change.status != "deleted" and change.kind == "file"
                (found.add if present else found.discard)(path)
        return found

    def has_object(self, oid: str) -> bool:
        return self.read(f".git/objects/{oid[:2]}/{oid[2:]}") is not None

    def refs(self) -> dict[str, str]:
        """Every ref: ``packed-refs`` overridden by the loose ones (ids, or ``ref: …`` when symbolic)."""
        found = _packed_refs(self.read(".git/packed-refs", _LARGE_MAX) or b"")
        for path in sorted(self.files(".git/refs")):
            value = _ref_value(self.read(path))
            if value is not None:
                found[path[len(".git/") :]] = value
        return found


def _read(path: Path, limit: int) -> bytes | None:
    """The regular file ``path`` (last component not followed) of at most ``limit`` bytes; else ``None``."""
    try:
        # getattr: Windows (the winjob backend's copy of a repository) has none of the three.
        flags = sum(getattr(os, name, 0) for name in ("O_NOFOLLOW", "O_NONBLOCK", "O_CLOEXEC", "O_BINARY"))
        fd = os.open(path, os.O_RDONLY | flags)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
            return None
        return fh.read(limit)


def _host_files(workspace: Path, rel: str) -> Iterator[str]:
    top = workspace / rel
    for dirpath, _dirs, files in os.walk(top):  # os.walk follows no symlinked directory
        base = PurePosixPath(rel) / PurePosixPath(Path(dirpath).relative_to(top).as_posix())
        for name in files:
            yield str(base / name)


def _ref_value(data: bytes | None) -> str | None:
    line = (data or b"").strip()
    if _ID.match(line):
        return line.decode()
    if line.startswith(b"ref: "):
        return _escape(line.decode("utf-8", "replace"))
    return None


def _packed_refs(data: bytes) -> dict[str, str]:
    found = {}
    for line in data.splitlines():
        oid, _, name = line.partition(b" ")
        if _ID.match(oid) and name.startswith(b"refs/"):
            found[_escape(name.decode("utf-8", "replace"))] = oid.decode()
    return found


def _text(data: bytes | None) -> str:
    return _escape((data or b"").decode("utf-8", "replace").strip()) if data is not None else "(none)"


# -- commits ------------------------------------------------------------------------------------------


@dataclass
class _Commit:
    oid: str
    parents: list[str]
    author: str
    subject: str

    def shown(self) -> dict[str, str]:
        return {"id": self.oid, "subject": self.subject, "author": self.author}


def _read_commit(view: _View, oid: str) -> _Commit | None:
    """The loose commit ``oid``, inflated no further than :data:`_COMMIT_MAX`; ``None`` when it is not one."""
    data = view.read(f".git/objects/{oid[:2]}/{oid[2:]}")
    if data is None:
        return None
    try:
        raw = zlib.decompressobj().decompress(data, _COMMIT_MAX)
    except zlib.error:
        return None
    header, _, body = raw.partition(b"\0")
    if not header.startswith(b"commit "):
        return None
    return _parse_commit(oid, body)


def _parse_commit(oid: str, body: bytes) -> _Commit:
    head, _, message = body.partition(b"\n\n")
    parents, author = [], ""
    for line in head.split(b"\n"):
        name, _, value = line.partition(b" ")
        if name == b"parent" and _ID.match(value):
            parents.append(value.decode())
        elif name == b"author":
            author = _escape(re.sub(rb" \d+ [+-]\d{4}$", b"", value).decode("utf-8", "replace"))
    subject = " ".join(message.split(b"\n\n", 1)[0].decode("utf-8", "replace").split())
    return _Commit(oid, parents, author, _escape(subject[:100]))


# -- the index ----------------------------------------------------------------------------------------


def _index_difference(old: _View, new: _View) -> int | None:
    """How many paths differ (mode or blob) between the two indexes; ``None`` if one is not v2/v3."""
    before = _index_entries(old.read(".git/index", _LARGE_MAX))
    after = _index_entries(new.read(".git/index", _LARGE_MAX))
    if before is None or after is None:
        return None
    return sum(before.get(path) != after.get(path) for path in set(before) | set(after))


def _index_entries(data: bytes | None) -> dict[bytes, bytes] | None:
    if data is None or data[:4] != b"DIRC" or int.from_bytes(data[4:8]) not in (2, 3):
        return None
    found, offset = {}, 12
    try:
        for _ in range(int.from_bytes(data[8:12])):
            offset, path, value = _index_entry(data, offset)
            found[path] = value
    except ValueError:
        return None
    return found


def _index_entry(data: bytes, offset: int) -> tuple[int, bytes, bytes]:
    """One v2/v3 entry at ``offset``: the next offset, its path, its mode and object id."""
    flags = int.from_bytes(data[offset + 60 : offset + 62])
    start = offset + 62 + (2 if flags & 0x4000 else 0)
    end = data.index(b"\0", start)
    value = data[offset + 24 : offset + 28] + data[offset + 40 : offset + 60]
    return offset + ((end - offset) // 8 + 1) * 8, data[start:end], value


# -- configuration --------------------------------------------------------------------------------


class ConfigError(ValueError):
    """A config file this parser does not fully understand (and so does not trust)."""


_SECTION = re.compile(r'^\[\s*([A-Za-z0-9.-]+)(?:\s+"((?:[^"\\\n]|\\.)*)")?\s*\]\s*(?:[#;].*)?$')
_UNESCAPE = re.compile(r"\\(.)")
_KEY = re.compile(r"^([A-Za-z][A-Za-z0-9-]*)\s*(?:=(.*))?$")


def parse_config(data: bytes) -> dict[str, list[str]]:
    """The keys of a git config file (``section[.subsection].name``, lower case but the
    subsection) and their values in order. Includes are keys like any other, never followed."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError("not UTF-8") from exc
    found: dict[str, list[str]] = {}
    section: str | None = None
    lines = iter(text.split("\n"))
    for number, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            section = _section(line, number)
            line = line[line.index("]") + 1 :].strip()
            if not line or line[0] in "#;":
                continue
        if section is None:
            raise ConfigError(f"line {number}: a key outside any section")
        name, value = _key_value(line, lines, number)
        found.setdefault(f"{section}.{name}", []).append(value)
    return found


def _section(line: str, number: int) -> str:
    close = line.find("]")
    match = _SECTION.match(line[: close + 1]) if close > 0 else None
    if match is None:
        raise ConfigError(f"line {number}: a section header this parser does not read")
    name, sub = match[1], match[2]
    if sub is None:
        head, _, rest = name.partition(".")  # the deprecated [section.sub] form
        return f"{head.lower()}.{rest.lower()}" if rest else head.lower()
    return name.lower() + "." + _UNESCAPE.sub(r"\1", sub)


def _key_value(line: str, lines: Iterator[str], number: int) -> tuple[str, str]:
    match = _KEY.match(line)
    if match is None:
        raise ConfigError(f"line {number}: not a key = value line")
    if match[2] is None:
        return match[1].lower(), "true"
    value = match[2]
    while value.endswith("\\") and not value.endswith("\\\\"):
        value = value[:-1] + next(lines, "")
    return match[1].lower(), _value(value, number)


def _value(raw: str, number: int) -> str:
    out, quoted, i = [], False, 0
    while i < len(raw):
        char = raw[i]
        if char == "\\":
            if i + 1 >= len(raw) or raw[i + 1] not in 'ntb"\\':
                raise ConfigError(f"line {number}: an escape this parser does not read")
            out.append({"n": "\n", "t": "\t", "b": "\b"}.get(raw[i + 1], raw[i + 1]))
            i += 2
            continue
        if char == '"':
            quoted = not quoted
        elif char in "#;" and not quoted:
            break
        else:
            out.append(char)
        i += 1
    if quoted:
        raise ConfigError(f"line {number}: an unclosed quote")
    return _escape("".join(out).strip())


# -- showing it -------------------------------------------------------------------------------------


def _escape(text: str) -> str:
    """``text`` with every unprintable character (terminal controls among them) escaped."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _short(oid: str | None) -> str:
    return oid[:7] if oid and _ID.match(oid.encode()) else str(oid)


def _ref_lines(refs: list[dict[str, Any]]) -> Iterator[str]:
    for item in refs:
        name = item["ref"].removeprefix("refs/heads/")
        commits = item.get("commits") or []
        if item["change"] == "moved":
            yield f"{name} moved {_short(item['old'])} → {_short(item['new'])}"
        else:
            yield f"{name} {item['change']} ({_short(item['old'] or item['new'])})"
        yield from _commit_lines(name, commits, item.get("packed", False))


def _commit_lines(name: str, commits: list[dict[str, str]], packed: bool) -> Iterator[str]:
    if packed:
        yield f"new commits on {name} are packed, not summarised"
    shown = [f'{c["id"][:7]} "{c["subject"]}" ({c["author"]})' for c in commits[:_SHOWN]]
    more = [f"… and {len(commits) - _SHOWN} more"] if len(commits) > _SHOWN else []
    noun = "commit" if len(commits) == 1 else "commits"
    if len(commits) == 1:
        yield f"1 new commit on {name}: {shown[0]}"
    elif commits:
        yield f"{len(commits)} new {noun} on {name}:"
        yield from (f"  {line}" for line in [*shown, *more])


def _state_lines(summary: GitSummary) -> Iterator[str]:
    if summary.head:
        yield f"HEAD {summary.head[0]} → {summary.head[1]}"
    if summary.index:
        differ = summary.index.get("paths_differ")
        count = "1 path differs" if differ == 1 else f"{differ} paths differ"
        yield "index changed" + (f" ({count})" if differ is not None else "")
    if summary.packed_refs:
        yield "packed-refs changed"


def _config_lines(config: list[dict[str, Any]]) -> Iterator[str]:
    for item in config:
        values = item["new"] if item["new"] is not None else item["old"]
        prefix = "RISKY " if item["risky"] else "config "
        yield f"{prefix}{item['key']} = {', '.join(values)} ({item['change']})"


def _risk_lines(summary: GitSummary) -> Iterator[str]:
    for hook in summary.hooks:
        if hook["status"] != "deleted":
            yield f"RISKY hook {hook['path']} ({hook['status']})"
    for other in summary.other:
        yield f"RISKY {other['path']} ({other['status']}) [{', '.join(other['flags'])}]"
    for reason in summary.risky:
        if reason.startswith((".git/config:", "the repository could not")) or " is never applied: " in reason:
            yield f"RISKY {reason}"
    if summary.gitmodules:
        yield f".gitmodules {summary.gitmodules} (submodule URLs: review before `git submodule update`)"
    held = "risky, held back without consent (--only .git)" if summary.risky else "nothing risky, applies with the rest"
    yield f"{summary.entries} entries under .git, one group: {held}"
