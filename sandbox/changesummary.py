"""A changeset a person can read: a total line and a per-directory summary, never every entry.

A run that installed 500 packages changed 14,000 entries; listing each (as ``sandbox run`` and
``sandbox changes show`` once did) buries the three that matter. :func:`summary_lines` turns any
changeset into at most ``budget`` lines (``sandbox run`` gives it what is left of
:data:`MAX_LINES` on stderr), in this order:

- the ``.git`` group's own summary (:mod:`sandbox.mounts.gitreview`), its RISKY lines first;
- each environment directory (profile ``[mount] environment``: ``.venv``, ``node_modules``…) in
  one line, :func:`sandbox.mounts.envdirs.summarise`'s (packages, files, bytes: the line its held-back
  item carries); a bare name (``__pycache__``) matches at any depth, its directories share a line;
- the ignored noise (profile ``[mount] ignore``, and the workspace's ``.gitignore`` as a hint),
  summed in one line; ignoring is for review only: those entries are kept and applied as ever;
- flagged entries (and entries that can never be applied) outside the environment groups, always
  named, up to :data:`FLAGGED_CAP`, then one line pointing at ``sandbox changes show ID --flagged``;
- the work: itemised when it is small (:data:`ITEMISE` entries), otherwise one line per top-level
  directory, split deeper while one directory holds most of it and the lines allow.

Names are data a jail chose: every line goes through :func:`sandbox.textsafe.printable`.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import stat
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from sandbox import diffbound
from sandbox._jailside.glob import translate
from sandbox.mounts import NOTICE_FLAGS, envdirs
from sandbox.textsafe import printable

if TYPE_CHECKING:
    from collections.abc import Collection, Iterable, Sequence

    from sandbox.changes import Kept
    from sandbox.mounts import Change

MAX_LINES = 20
"""What ``sandbox run`` prints about a changeset on stderr, whatever its size."""
ITEMISE = 10
"""Up to this many work entries are listed one by one."""
FLAGGED_CAP = 5
"""Flagged entries named in a summary before the rest are counted."""
ENVIRONMENT_CAP = 4
"""Environment lines before the rest share one."""
GIT_CAP = 8
_GITIGNORE_MAX = 64 * 1024  # a hint, read bounded: a jail never wrote it (it is the host's file)
STAT_DEADLINE_S = 5.0
_STAT_MAX = 1 << 20


@dataclass(frozen=True)
class Rules:
    """What a summary sets apart from the work: environment directories and ignored noise."""

    environment: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    gitignore: tuple[str, ...] = ()

    @classmethod
    def of(cls, workspace: Path | None, environment: Iterable[str] = (), ignore: Iterable[str] = ()) -> Rules:
        hint = _gitignore(workspace) if workspace is not None else ()
        return cls(tuple(environment), tuple(ignore), hint)

    @classmethod
    def of_profile(cls, profile: Any, workspace: Path | None) -> Rules:
        """The rules of a profile (``mount.environment``, ``mount.ignore``) for ``workspace``."""
        mount = profile.mount
        return cls.of(workspace, getattr(mount, "environment", ()), getattr(mount, "ignore", ()))

    @classmethod
    def of_kept(cls, kept: Kept) -> Rules:
        """A kept changeset's rules: the environment its manifest recorded, the ignore list of the
        profile it names (by name: a review hint, so a profile gone since only loses the hint)."""
        from sandbox import profile as profiles
        from sandbox.errors import SandboxError

        try:
            ignore = profiles.load(kept.profile).mount.ignore
        except (SandboxError, OSError, ValueError):
            ignore = ()
        return cls.of(kept.workspace, getattr(kept, "environment", ()), ignore)

    @functools.cached_property
    def _ignored(self) -> list[tuple[bool, re.Pattern[str]]]:
        return [_gitignore_rule(p) for p in (*self.gitignore, *self.ignore) if p.strip("!/")]

    def ignored(self, path: str) -> bool:
        """gitignore's reading: the last pattern that matches decides, ``!`` re-includes."""
        verdict = False
        for negated, regex in self._ignored:
            if regex.fullmatch(path):
                verdict = not negated
        return verdict

    def environment_dir(self, path: str) -> str | None:
        """The environment directory ``path`` is in (or is): the apply's own rule (:mod:`sandbox.mounts.envdirs`)."""
        return envdirs.group_of(path, self.environment) if self.environment else None


def _gitignore_rule(pattern: str) -> tuple[bool, re.Pattern[str]]:
    negated = pattern.startswith("!")
    body = pattern.removeprefix("!").rstrip("/")  # a directory pattern: here, the directory and all below
    anchored = "/" in body
    regex = translate(body.lstrip("/"))
    return negated, re.compile(("" if anchored else "(?:.*/)?") + regex + "(?:/.*)?")


def _gitignore(workspace: Path) -> tuple[str, ...]:
    try:
        fd = os.open(workspace / ".gitignore", os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return ()
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return ()
        text = fh.read(_GITIGNORE_MAX).decode("utf-8", "replace")
    lines = (line.strip() for line in text.splitlines())
    return tuple(line for line in lines if line and not line.startswith("#"))


# -- grouping -------------------------------------------------------------------------------------


@dataclass
class Groups:
    """A changeset split the way a reviewer reads it."""

    git: list[Change]
    environment: dict[str, list[Change]]
    ignored: list[Change]
    work: list[Change]


def classify(changes: Iterable[Change], rules: Rules, git_group: Collection[str] = ()) -> Groups:
    groups = Groups([], defaultdict(list), [], [])
    for change in changes:
        if change.path in git_group:
            groups.git.append(change)
        elif (where := rules.environment_dir(change.path)) is not None:
            groups.environment[where].append(change)
        elif rules.ignored(change.path):
            groups.ignored.append(change)
        else:
            groups.work.append(change)
    return groups


def notable(change: Change) -> bool:
    """Whether a reviewer must see this entry by name: flagged (a flag that asks consent: not a
    ``system-link``, :data:`sandbox.mounts.NOTICE_FLAGS`), or never applicable."""
    return bool(set(change.flags) - NOTICE_FLAGS) or not change.applicable


# -- lines ----------------------------------------------------------------------------------------


def total_line(changes: Sequence[Change]) -> str:
    """``14,212 changes (14,180 added, 30 modified, 2 deleted), 90 MiB``."""
    return f"{_count(len(changes), 'change')} ({_statuses(changes)}), {human_size(_bytes(changes))}"


def summary_lines(
    changes: Sequence[Change],
    rules: Rules,
    *,
    git_lines: Sequence[str] = (),
    git_group: Collection[str] = (),
    changeset_id: str | None = None,
    budget: int = MAX_LINES - 1,
) -> list[str]:
    """At most ``budget`` lines (at least 4) that sum ``changes`` up, without the total line."""
    budget = max(budget, 4)
    groups = classify(changes, rules, git_group)
    show = f"sandbox changes show {changeset_id}" if changeset_id else "sandbox changes show ID"
    lines = _git_lines(list(git_lines), show) if groups.git or git_lines else []
    lines += _environment_lines(groups.environment)
    if groups.ignored:
        lines.append(f"ignored (mount.ignore, .gitignore): {_tally(groups.ignored)}; kept and applied as the rest")
    room = budget - len(lines)
    small = len(groups.work) <= min(ITEMISE, room)
    named = [c for c in (groups.ignored if small else [*groups.work, *groups.ignored]) if notable(c)]
    if small:
        lines += [item_line(c) for c in groups.work]
    lines += _named_lines(named, show, budget - len(lines) - (0 if small else 1))
    if not small:
        lines += _work_lines(groups.work, budget - len(lines))
    return _capped([printable(line) for line in lines], budget, show)


def item_line(change: Change) -> str:
    """``A path  [flags]  (never applied: why)``, as a run lists an entry."""
    flags = f"  [{', '.join(change.flags)}]" if change.flags else ""
    skip = f"  (never applied: {change.reason})" if not change.applicable else ""
    return printable(f"{change.status[0].upper()} {change.path}{flags}{skip}")


def _git_lines(lines: list[str], show: str) -> list[str]:
    """The git summary, in its order; past :data:`GIT_CAP` the risks and the group's verdict (its
    last line) are kept before the rest (500 new tags are counted, not listed)."""
    if len(lines) <= GIT_CAP:
        return lines
    last = len(lines) - 1
    ranked = sorted(range(len(lines)), key=lambda i: not ("RISKY" in lines[i] or i == last))
    kept = sorted(ranked[: GIT_CAP - 1])
    return [*(lines[i] for i in kept), f"git: {len(lines) - len(kept)} more lines: {show}"]


def _environment_lines(found: dict[str, list[Change]]) -> list[str]:
    """One line per environment directory; directories of one bare name (``__pycache__``) share it."""
    by_name: dict[str, list[str]] = defaultdict(list)
    for where in sorted(found):
        by_name[PurePosixPath(where).name].append(where)
    ranked = sorted(by_name.values(), key=lambda dirs: -sum(len(found[d]) for d in dirs))
    lines = [_environment_line(dirs, [c for d in dirs for c in found[d]]) for dirs in ranked[:ENVIRONMENT_CAP]]
    if len(ranked) > ENVIRONMENT_CAP:
        rest = [c for dirs in ranked[ENVIRONMENT_CAP:] for d in dirs for c in found[d]]
        more = len(ranked) - ENVIRONMENT_CAP
        lines.append(f"and {more} more environment directories: {_files_bytes(rest)} -- not applied unless asked")
    return lines


def _environment_line(dirs: list[str], entries: list[Change]) -> str:
    if len(dirs) == 1:  # the line the apply's held-back item carries too
        return envdirs.summarise(entries, dirs[0]).line()
    flagged = sum(1 for c in entries if notable(c))
    held = f", {flagged:,} flagged" if flagged else ""
    label = f"{PurePosixPath(dirs[0]).name} ({len(dirs)} directories)"
    return f"{label}: {_files_bytes(entries)}{held} -- environment, not applied unless asked (--include-environment)"


def _named_lines(named: list[Change], show: str, room: int) -> list[str]:
    if not named:
        return []
    named = _ranked(named)
    cap = min(FLAGGED_CAP, max(room, 1))
    if len(named) <= cap:
        return [item_line(c) for c in named]
    return [*(item_line(c) for c in named[: cap - 1]), f"and {len(named) - cap + 1:,} more flagged: {show} --flagged"]


_SEVERE = frozenset({"git-hook", "git-config", "tool-config", "setuid", "symlink-outside", "special-file"})


def _ranked(named: list[Change]) -> list[Change]:
    """The most telling first: what runs or escapes by itself (a hook, setuid, a link out), then
    other flags (a new executable), then bare dotfiles; within a tier one entry per top-level
    directory in turn, so a thousand entries of one directory cannot crowd out another's."""
    seen: dict[tuple[int, str], int] = defaultdict(int)
    keyed = []
    for change in sorted(named, key=lambda c: c.path):
        tier = _tier(change)
        top = PurePosixPath(change.path).parts[0]
        keyed.append(((tier, seen[tier, top], change.path), change))
        seen[tier, top] += 1
    return [change for _key, change in sorted(keyed, key=lambda item: item[0])]


def _tier(change: Change) -> int:
    if _SEVERE & set(change.flags) or not change.applicable:
        return 0
    return 2 if set(change.flags) <= {"dotfile"} else 1


def _work_lines(work: list[Change], room: int) -> list[str]:
    if not work:
        return []
    room = max(room, 1)
    groups = _split(work, room)
    if len(groups) > room:
        ranked = sorted(groups, key=lambda k: -len(groups[k]))
        rest = [c for k in ranked[room - 1 :] for c in groups[k]]
        groups = {k: groups[k] for k in ranked[: room - 1]}
        return [*_group_lines(groups), f"and {len(ranked) - room + 1:,} more directories: {_tally(rest)}"]
    return _group_lines(groups)


def _group_lines(groups: dict[tuple[str, ...], list[Change]]) -> list[str]:
    lines = []
    for key in sorted(groups):
        entries = groups[key]
        if len(entries) == 1:  # one entry says more by its name than by a count
            lines.append(item_line(entries[0]))
        else:
            lines.append(f"{'/'.join(key)}/: {_tally(entries)}")
    return lines


def _split(work: list[Change], room: int) -> dict[tuple[str, ...], list[Change]]:
    """One group per top-level name, the largest split while it holds most of the work and the
    lines allow. A directory's own entry is counted in the total only once it is split."""
    groups: dict[tuple[str, ...], list[Change]] = defaultdict(list)
    for change in work:
        groups[PurePosixPath(change.path).parts[:1]].append(change)
    while True:
        largest = max(groups, key=lambda k: len(groups[k]))
        children = _children(largest, groups[largest])
        if 2 * len(groups[largest]) <= len(work) or not children or len(groups) - 1 + len(children) > room:
            return dict(groups)
        del groups[largest]
        groups.update(children)


def _children(key: tuple[str, ...], entries: list[Change]) -> dict[tuple[str, ...], list[Change]]:
    children: dict[tuple[str, ...], list[Change]] = defaultdict(list)
    for change in entries:
        parts = PurePosixPath(change.path).parts
        if len(parts) > len(key):
            children[parts[: len(key) + 1]].append(change)
    return children


def _capped(lines: list[str], budget: int, show: str) -> list[str]:
    if len(lines) <= budget:
        return lines
    return [*lines[: budget - 1], f"and {len(lines) - budget + 1} more lines: {show}"]


# -- counting -------------------------------------------------------------------------------------


def _tally(changes: Sequence[Change]) -> str:
    return f"{_count(len(changes), 'change')} ({_statuses(changes)}), {human_size(_bytes(changes))}"


def _files_bytes(changes: Sequence[Change]) -> str:
    files = sum(1 for c in changes if c.kind != "dir")
    return f"{_count(files, 'file')}, {human_size(_bytes(changes))}"


def _statuses(changes: Sequence[Change]) -> str:
    counts = {"added": 0, "modified": 0, "deleted": 0}
    for change in changes:
        counts[change.status] += 1
    return ", ".join(f"{n:,} {status}" for status, n in counts.items() if n) or "none"


def _bytes(changes: Iterable[Change]) -> int:
    """The content a changeset carries: files as the jail left them (a directory's size is no content)."""
    return sum(c.size or 0 for c in changes if c.kind == "file" and c.status != "deleted")


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def human_size(n: int) -> str:
    """Binary units, as ``du -h`` reads them: ``512 bytes``, ``1.5 KiB``, ``90 MiB``."""
    if n < 1024:
        return _count(n, "byte")
    value = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024 or unit == "TiB":
            break
    return f"{value:.1f} {unit}" if value < 10 else f"{value:.0f} {unit}"


# -- diffstat -------------------------------------------------------------------------------------


def stat_lines(changes: Sequence[Change], workspace: Path, kept_tree: Path) -> list[str]:
    """One line per entry, diffstat-like: ``path | +3 -1`` for text, sizes otherwise.

    Text files are compared with :mod:`sandbox.diffbound` under one deadline: past it, or past
    its bounds, a file's counts are the upper bounds it gives (``+<=N``).
    """
    deadline = time.monotonic() + STAT_DEADLINE_S
    width = min(max((len(c.path) for c in changes), default=0), 60)
    return [printable(f"{c.path:<{width}} | {_stat(c, workspace, kept_tree, deadline)}") for c in changes]


def _stat(change: Change, workspace: Path, kept_tree: Path, deadline: float) -> str:
    flags = f"  [{', '.join(change.flags)}]" if change.flags else ""
    if change.kind != "file":
        target = f" -> {change.target}" if change.kind == "symlink" and change.target else ""
        return f"{change.status} {change.kind}{target}{flags}"
    before = _lines(workspace / change.path) if change.status != "added" else []
    after = _lines(kept_tree / change.path) if change.status != "deleted" else []
    if before is None or after is None:
        return f"{change.status}, {human_size(change.size or 0)} (binary or large){flags}"
    try:
        diff = list(diffbound.unified(before, after, deadline=deadline))
    except diffbound.TooCostly as exc:
        return f"+<={exc.added} -<={exc.removed}{flags}"
    body = [line for line in diff if not line.startswith(("+++", "---"))]
    plus, minus = sum(line.startswith("+") for line in body), sum(line.startswith("-") for line in body)
    return f"+{plus} -{minus}{flags}"


def _lines(path: Path) -> list[str] | None:
    """A text file's lines (its last component not followed); ``None`` when binary or large, or gone."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
        with os.fdopen(fd, "rb") as fh:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size > _STAT_MAX:
                return None
            data = fh.read(_STAT_MAX + 1)
        if b"\0" in data[:8192]:
            return None
        try:
            return data.decode("utf-8").splitlines(keepends=True)
        except UnicodeDecodeError:
            return None
    return []  # absent on this side: an empty file, as the diff reads it
