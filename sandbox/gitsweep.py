"""After the calls of a ``rw`` jail: what git would obey that a call left in a git directory, moved away.

In ``rw`` the workspace's ``.git`` stays writable (commits in the jail are a feature); what git
obeys there is bound read-only (:func:`sandbox.backends.seal.git_binds`). No mount can forbid a
*new* name in a writable directory, and git obeys some names it finds at the top of a git
directory (gitrepository-layout(5), git-rebase(1), git-cherry-pick(1)): :data:`SWEPT`. A
``commondir`` makes the host's next ``git status`` read another git directory's config and hooks;
a ``rebase-merge/git-rebase-todo`` (or ``sequencer/todo``) runs its ``exec`` lines on the host's
``git rebase --continue``; ``remotes/`` and ``branches/`` rename where ``fetch`` and ``push`` go.

So the executor takes each of those names' state (:class:`State`: a ``lstat``, and for a
directory one listing of it) in every git directory of the workspace (the workspace's own, the
submodules' under ``.git/modules``, nested repositories the seal found) when a jail's first call
in flight starts, and again when its last call in flight has ended: by then every process those
calls started is dead (:func:`sandbox.exec.run` kills the tree first), so nothing of the jail can
write. Each name that is new or changed is **moved** (never deleted) into the data directory's
``quarantine`` (0700), and reported (:attr:`sandbox.exec.ExecResult.quarantined`). A name that
was there before (the user's own rebase in progress on the host) is left alone while nothing
changed it. A git operation the jail starts and finishes in one call (``git rebase``,
``cherry-pick``) removes its state itself and is not touched; one left in progress **cannot span
calls** in ``rw``: its state is quarantined (and can be moved back by hand).

Limits: while calls run, the planted name is there, and a host ``git`` run at that moment obeys
it (the window is the calls' own duration). A repository the calls *created* (``git init``,
``git clone``, a planted ``sub/.git``) is judged when the window closes (:func:`created`): its
hooks, a ``.git`` pointer file, the swept names and a config with a key beyond
:data:`SAFE_CONFIG` are quarantined; an honest clone keeps its config and history.

Standard library only, and cheap: a few ``lstat`` per git directory per call (see bench).
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import stat
import time
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    import weakref
    from collections.abc import Iterable, Sequence

    from sandbox.backends.base import Jail

SWEPT: dict[str, str] = {
    "commondir": "points git at another git directory (its config and hooks)",
    "rebase-merge": "a rebase in progress: its todo's exec lines run on `git rebase --continue`",
    "rebase-apply": "an am or rebase in progress, resumed by `--continue`",
    "sequencer": "a cherry-pick or revert in progress: its todo's exec lines and options run on `--continue`",
    "remotes": "remote shorthands: where fetch, pull and push go",
    "branches": "remote shorthands (deprecated): where fetch and pull go",
    "config.worktree": "configuration git reads when extensions.worktreeConfig is set",
}
"""Names at the top of a git directory that git obeys (runs, or follows elsewhere) and that
the read-only binds cannot cover, since a jail may create them: gitrepository-layout(5) for
``commondir``, ``remotes``, ``branches``, ``config.worktree``; the state directories of
git-rebase(1), git-am(1), git-cherry-pick(1) and git-revert(1). The rest of a git directory is
either sealed (config, hooks, info, objects/info, worktrees) or data (objects, refs, logs, index)."""
QUARANTINE = "quarantine"
"""The data directory's folder holding what a sweep moved, one sub-folder per sweep."""
_LISTED_MAX = 256  # entries of a state directory fingerprinted one by one; past that, the directory alone

Stamp = tuple[int, int, int, int, int]  # mode, inode, size, mtime, ctime
Fingerprint = tuple[Stamp, tuple[tuple[str, Stamp], ...]]


def _stamp(st: os.stat_result) -> Stamp:
    return st.st_mode, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def _fingerprint(path: str) -> Fingerprint | None:
    """``path``'s own stamp and, for a directory, its entries' (an edited todo changes no directory time)."""
    try:
        st = os.lstat(path)
    except OSError:
        return None  # not there: nothing to obey
    if not stat.S_ISDIR(st.st_mode):
        return _stamp(st), ()
    try:  # (unreadable, or gone meanwhile: the directory's own stamp still tells it apart)
        with os.scandir(path) as entries:
            inside = [(e.name, _stamp(e.stat(follow_symlinks=False))) for e in itertools.islice(entries, _LISTED_MAX)]
    except OSError:
        inside = []
    return _stamp(st), tuple(sorted(inside))


RACY_NS = 2_000_000_000
"""A git directory changed this shortly before the state was taken is listed again at the sweep:
within one timestamp tick a new name could leave its times as they were (git's "racy" entries)."""


class _Dir(NamedTuple):
    stamp: Stamp | None  # the git directory's own (None: not there)
    found: dict[str, Fingerprint]  # the SWEPT names in it


class State(NamedTuple):
    """The :data:`SWEPT` names present in some git directories, and those directories' times."""

    workspace: str
    taken: int  # time.time_ns() before the first stat
    dirs: dict[str, _Dir]  # workspace-relative git directory -> what it held


def _look(path: str) -> _Dir:
    """One ``lstat`` and one listing of a git directory."""
    try:
        st = os.lstat(path)
        names = SWEPT.keys() & set(os.listdir(path))
    except OSError:
        return _Dir(None, {})
    marks = {name: _fingerprint(f"{path}/{name}") for name in names}
    return _Dir(_stamp(st), {name: mark for name, mark in marks.items() if mark is not None})


def take(workspace: str, gitdirs: Sequence[str]) -> State:
    taken = time.time_ns()
    return State(workspace, taken, {gitdir: _look(f"{workspace}/{gitdir}") for gitdir in gitdirs})


def planted(before: State) -> list[str]:
    """What is new or changed since ``before`` (workspace-relative paths).

    A name comes or goes only with its directory's mtime and ctime (a ctime cannot be set back):
    a git directory whose times held, and were not racy, is looked at only where a name already was
    (an edited todo changes no directory time). Otherwise it is listed again."""
    found = []
    for gitdir, was in before.dirs.items():
        path = f"{before.workspace}/{gitdir}"
        try:
            same = was.stamp is not None and _stamp(os.lstat(path)) == was.stamp
        except OSError:
            same = False
        if same and was.stamp is not None and max(was.stamp[3], was.stamp[4]) < before.taken - RACY_NS:
            now = {name: mark for name in was.found if (mark := _fingerprint(f"{path}/{name}")) is not None}
        else:
            now = _look(path).found
        found += [f"{gitdir}/{name}" for name, mark in now.items() if was.found.get(name) != mark]
    return found


def gitdirs(workspace: str, nested: Iterable[str]) -> tuple[str, ...]:
    """The git directories of the workspace's repository and of ``nested`` ones, submodules' included."""
    from sandbox.mounts import gitobeyed, gitreview  # their own imports are stdlib

    ws = Path(workspace)
    roots = ("", *nested)
    return tuple(d for root in roots if gitreview.is_repository(ws / root) for d in gitobeyed.git_dirs(ws, root))


# -- quarantine ---------------------------------------------------------------------------------------


def quarantine(workspace: str, paths: Sequence[str]) -> list[dict[str, str]]:
    """Move each of ``paths`` (workspace-relative) out of git's sight, into the data directory's
    quarantine; where that cannot be done (another file system and a copy that fails, no data
    directory), renamed in place to a name git never reads. Never deleted."""
    if not paths:
        return []
    folder = _folder()
    moved = []
    for rel in paths:
        item = {"path": rel, "why": SWEPT.get(rel.rsplit("/", 1)[-1], "")}
        try:
            item["moved_to"] = _move(f"{workspace}/{rel}", folder / rel if folder is not None else None)
        except OSError as exc:  # not even renamed in place (a directory we may not write): said loudly
            item["moved_to"], item["error"] = "", f"{exc.strerror or exc}: remove it before running git here"
        moved.append(item)
    return moved


def _folder() -> Path | None:
    from sandbox import datadir
    from sandbox.errors import SandboxError

    try:
        top = datadir.subdir(QUARANTINE)
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        return datadir.private_dir(top / f"{stamp}-{os.urandom(4).hex()}")
    except SandboxError:
        return None


def _move(source: str, target: Path | None) -> str:
    """Where ``source`` went: ``target`` (a rename, or a copy then removal across file systems),
    else a name beside it that git ignores. The rename in place comes first across file
    systems: git stops obeying it at once, whatever the copy then does."""
    if target is not None:
        _make_parents(target)
        try:
            os.rename(source, target)
            return str(target)
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                target = None
    aside = f"{os.path.dirname(source)}/sandbox-quarantined.{os.path.basename(source)}.{os.urandom(4).hex()}"
    os.rename(source, aside)
    if target is None:
        return aside
    try:
        _copy(aside, target)
    except OSError:
        return aside
    _remove(aside)
    return aside if os.path.lexists(aside) else str(target)


def _make_parents(target: Path) -> None:
    from sandbox import datadir
    from sandbox.errors import SandboxError

    with contextlib.suppress(SandboxError):  # then the rename fails, and the name is set aside in place
        datadir.private_dir(target.parent, parents=True)


def _copy(source: str, target: Path) -> None:
    """A copy that follows no link and opens no special file (a FIFO would block the read)."""
    import shutil  # here: `sandbox run`'s quick path imports this module, and seldom copies

    st = os.lstat(source)
    if stat.S_ISLNK(st.st_mode):
        os.symlink(os.readlink(source), target)
    elif stat.S_ISDIR(st.st_mode):
        shutil.copytree(source, target, symlinks=True, ignore=_special, ignore_dangling_symlinks=True)
    elif stat.S_ISREG(st.st_mode):
        shutil.copy2(source, target, follow_symlinks=False)
    else:
        raise OSError(errno.EINVAL, "not a file, a directory or a link", source)


def _special(folder: str, names: list[str]) -> set[str]:
    """``copytree``'s ignore: what is neither a file, a directory nor a link (left in the copy set aside)."""
    skipped = set()
    for name in names:
        with contextlib.suppress(OSError):
            mode = os.lstat(os.path.join(folder, name)).st_mode
            if stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode):
                continue
        skipped.add(name)
    return skipped


def _remove(path: str) -> None:
    import shutil

    with contextlib.suppress(OSError):
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)


# -- per jail: one window per run of overlapping calls ------------------------------------------------


class _Window:
    """The calls of one jail in flight, and the state taken when the first of them started."""

    def __init__(self) -> None:
        self.calls = 0
        self.before: State | None = None
        self.nested: frozenset[str] = frozenset()  # nested repositories when the window opened


_WINDOWS: weakref.WeakKeyDictionary[object, _Window] | None = None  # made on first use (see _copy)


def _window(jail: object) -> _Window:
    global _WINDOWS
    if _WINDOWS is None:
        import weakref

        _WINDOWS = weakref.WeakKeyDictionary()
    return _WINDOWS.setdefault(jail, _Window())


def opening(jail: object, workspace: str, nested: Iterable[str]) -> None:
    """A call of ``jail`` starts (before it spawns): the first one in flight takes the state."""
    window = _window(jail)
    window.calls += 1
    if window.calls == 1:
        window.nested = frozenset(nested)
        window.before = take(workspace, gitdirs(workspace, window.nested))


def closing(jail: object) -> tuple[list[str], frozenset[str] | None]:
    """A call of ``jail`` has ended, its processes dead: when it was the last in flight, what the
    calls planted (to :func:`quarantine`) and the nested repositories known when they began;
    while others still run, nothing yet (they could be in the middle of a rebase of their own:
    the last one to end sweeps)."""
    window = _WINDOWS.get(jail) if _WINDOWS is not None else None
    if window is None or window.calls == 0:
        return [], None
    window.calls -= 1
    if window.calls or window.before is None:
        return [], None
    before, window.before = window.before, None
    return planted(before), window.nested


# -- repositories a call created ----------------------------------------------------------------------

SAFE_CONFIG = frozenset(
    {
        "core.repositoryformatversion",
        "core.filemode",
        "core.bare",
        "core.logallrefupdates",
        "core.ignorecase",
        "core.precomposeunicode",
        "core.symlinks",
        "remote.*.url",
        "remote.*.fetch",
        "branch.*.remote",
        "branch.*.merge",
        "user.name",
        "user.email",
        "init.defaultbranch",
        "extensions.objectformat",
    }
)
"""What ``git init``, ``git clone`` and a commit's identity write to a repository's config, and all
a repository a call created may keep there: every other key (``core.fsmonitor``, ``core.hooksPath``,
``core.sshCommand``, ``core.pager``, filters and diff drivers, ``!`` aliases, ``include.path``,
credential helpers …) could run a program when the user later runs git inside it. An allowlist:
what git adds in a future release is judged unsafe until listed."""


def config_keys(text: str) -> set[str] | None:
    """The keys of a git config file as ``section.name`` or ``section.*.name`` (lower case);
    ``None`` when a line is not understood (a continuation, an odd header): judged unsafe."""
    keys: set[str] = set()
    section = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            head = line[1 : line.find("]")] if "]" in line else ""
            name, _, sub = head.partition(" ")
            if not name or line.endswith("\\"):
                return None
            section = f"{name.lower()}.*" if sub or "." in name else name.lower()
            line = line[line.find("]") + 1 :].strip()
            if not line or line[0] in "#;":
                continue
        if section is None or line.endswith("\\"):
            return None
        key = line.split("=", 1)[0].strip().lower()
        if not key.replace("-", "").isalnum():
            return None
        keys.add(f"{section}.{key}")
    return keys


def created(workspace: str, before: frozenset[str], now: Iterable[str]) -> list[str]:
    """In each repository that ``now`` finds and ``before`` did not (made by the calls), what the
    host's git would run: a ``.git`` that is a file (a pointer elsewhere); hooks that are not
    git's ``*.sample``; a config with a key outside :data:`SAFE_CONFIG`; the :data:`SWEPT` names."""
    found: list[str] = []
    for root in sorted(set(now) - before):
        gitdir = f"{root}/.git"
        path = f"{workspace}/{gitdir}"
        try:
            if not stat.S_ISDIR(os.lstat(path).st_mode):
                found.append(gitdir)
                continue
            hooks = [f"{gitdir}/hooks/{n}" for n in _names(f"{path}/hooks") if not n.endswith(".sample")]
        except OSError:
            continue
        # (git init's templates make an empty branches/: nothing in it to obey)
        swept = [name for name in SWEPT if os.path.lexists(f"{path}/{name}") and not _empty_dir(f"{path}/{name}")]
        found += hooks + [f"{gitdir}/{name}" for name in swept]
        if not _safe_config(f"{path}/config"):
            found.append(f"{gitdir}/config")
    return found


def _empty_dir(path: str) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode) and not os.listdir(path)
    except OSError:
        return False


def _names(folder: str) -> list[str]:
    try:
        return os.listdir(folder)
    except FileNotFoundError:
        return []


def _safe_config(path: str) -> bool:
    try:
        with open(path, "rb") as fh:
            text = fh.read(1 << 20).decode("utf-8", "replace")
    except FileNotFoundError:
        return True
    except OSError:
        return False
    keys = config_keys(text)
    return keys is not None and keys <= SAFE_CONFIG


def summary(moved: Sequence[dict[str, str]]) -> str:
    """One line for the model and the user."""
    names = ", ".join(f"{m['path']} -> {m['moved_to'] or 'NOT MOVED (' + m.get('error', '') + ')'}" for m in moved)
    return (
        f"[sandbox: quarantined what git would obey and this call left in a git directory: {names}; "
        "a rebase, cherry-pick or am cannot stay in progress across calls in rw mode]"
    )


class Call:
    """One call of a jail, as the executor sees it: the window opened before it spawns, and
    :meth:`end` once every process it started is dead. Only ``rw`` jails that seal a workspace
    (bwrap, Docker) take part: elsewhere the jail writes a copy, or nothing, or is no boundary."""

    def __init__(self, jail: Jail) -> None:
        self.watch = getattr(jail, "_watch", None)  # the seal the backend searches before each call
        self.jail: Jail | None = None
        if jail.mount == "rw" and self.watch is not None:
            self.jail = jail
            opening(jail, str(jail.workspace), self.watch.sealed.nested)

    async def end(self) -> list[dict[str, str]]:
        """What was quarantined (idempotent: a second call returns nothing)."""
        jail, self.jail = self.jail, None
        if jail is None:
            return []
        found, nested = closing(jail)
        if nested is None:
            return []
        import functools

        import anyio

        from sandbox.threads import off_loop, soon

        watch, workspace = self.watch, str(jail.workspace)
        assert watch is not None  # a jail takes part only with one
        with anyio.CancelScope(shield=True):  # also when the call was cancelled: the move must happen
            made = functools.partial(_created_in, workspace, nested, watch.deny_read)
            found += [path for path in await soon(made, inline=watch.quick) if path not in found]
            moved = await off_loop(quarantine, workspace, found) if found else []
        return moved


def _created_in(workspace: str, nested: frozenset[str], deny_read: Iterable[str]) -> list[str]:
    """What git would run in the repositories the calls created (the seal's cached search finds them)."""
    from sandbox.backends import seal

    return created(workspace, nested, seal.find(workspace, deny_read).nested)
