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

The reading is apart: :mod:`sandbox.mounts.gitfiles` (refs, commits, the index as files) and
:mod:`sandbox.mounts.gitconfig` (the config parser); so is what the host's git obeys, which
``rw``'s seal and the review flags ask about (:mod:`sandbox.mounts.gitobeyed`).
"""

from __future__ import annotations

import fnmatch
import os
import re
import stat
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from sandbox.mounts.gitconfig import ConfigError, parse_config
from sandbox.mounts.gitfiles import OBJECT_ID, View, index_difference, read_commit, shown_text

if TYPE_CHECKING:
    from collections.abc import Iterator

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
    old, new = View(workspace), View(workspace, kept_tree, inside)
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


def _summarise_refs(summary: GitSummary, old: View, new: View, paths: dict[str, Change]) -> None:
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


def _new_commits(view: View, tip: str, fresh: set[str], packs: bool) -> tuple[list[dict[str, str]], bool]:
    """The commits reachable from ``tip`` whose loose objects the changeset adds, newest first."""
    if tip not in fresh:
        return [], packs and not view.has_object(tip)
    found: list[dict[str, str]] = []
    queue, seen = [tip], {tip}
    while queue and len(found) < _COMMITS_MAX:
        commit = read_commit(view, queue.pop(0))
        if commit is None:
            return found, True
        found.append(commit.shown())
        for parent in commit.parents:
            if parent in fresh and parent not in seen:
                seen.add(parent)
                queue.append(parent)
    return found, False


def _summarise_state(summary: GitSummary, old: View, new: View, paths: dict[str, Change]) -> None:
    if ".git/HEAD" in paths:
        was, now = shown_text(old.read(".git/HEAD")), shown_text(new.read(".git/HEAD"))
        summary.head = [was, now] if was != now else None
    if ".git/index" in paths:
        summary.index = {"changed": True, "paths_differ": index_difference(old, new)}
    summary.packed_refs = ".git/packed-refs" in paths


def _summarise_config(summary: GitSummary, old: View, new: View, paths: dict[str, Change]) -> None:
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


def _short(oid: str | None) -> str:
    return oid[:7] if oid and OBJECT_ID.match(oid.encode()) else str(oid)


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
