"""The deny layer's commands: formatting a disk, writing a raw block device, deleting what must stay.

Seed 004 keeps two classes in its deny layer, never run and never asked: formatting a disk or
writing a raw block device, and deleting /, a home directory or a drive root. Deleting another
top-level system directory (/usr, /etc …) is asked instead. These are judged by a command's name
and operands alone, also among the words of text the grammar rejects, so they stand apart from
the command judge (:mod:`sandbox.policy.commands`), which hands them every simple command.
"""

from __future__ import annotations

import fnmatch
import itertools
import os
import re
from typing import TYPE_CHECKING, Literal

from sandbox.policy.flags import shape
from sandbox.policy.paths import entry_path
from sandbox.policy.verdict import Finding

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    from sandbox.policy.paths import PathPolicy
    from sandbox.policy.shell import Word

Doom = Literal["deny", "ask"]  # what deleting a path is: a deny-layer target, or an asked one

FORMATTERS = frozenset(
    {
        "mke2fs",
        "mkswap",
        "wipefs",
        "fdisk",
        "sfdisk",
        "cfdisk",
        "gdisk",
        "sgdisk",
        "parted",
        "mkntfs",
        "mkdosfs",
        "newfs",
        "format",
        "blkdiscard",
        "mklabel",
        "mkexfatfs",
        "mkudffs",
    }
)
# Tools that format with one of their subcommands, lower-cased (diskutil's verbs ignore case;
# diskutil list only reads).
FORMAT_SUBCOMMANDS: dict[str, frozenset[str]] = {
    "diskutil": frozenset(
        {"erasedisk", "erasevolume", "reformat", "partitiondisk", "zerodisk", "randomdisk", "secureerase"}
    ),
    "cryptsetup": frozenset({"luksformat", "erase", "lukserase"}),
    "nvme": frozenset({"format", "sanitize"}),
}
DELETERS = frozenset({"rm", "rmdir", "unlink", "shred", "srm", "wipe", "trash", "trash-put"})
# The names the deny layer looks at (and every mkfs*), found even in text the grammar rejects.
DENY_LAYER_NAMES = DELETERS | FORMATTERS | frozenset(FORMAT_SUBCOMMANDS) | {"dd", "find", "mv"}
# Deleting a home directory is in the deny layer: every child of these is one (Fedora Atomic's
# /home is a link to /var/home), and so are root's homes on Linux and macOS.
HOME_PARENTS = frozenset({"/home", "/Users", "/var/home"})
ROOT_HOMES = frozenset({"/root", "/var/root"})
# Deleting one of these is asked, not denied: seed 004 moved system directories out of its deny
# layer, and in a jail they are read-only anyway.
SYSTEM_DIRS = frozenset(
    {
        "/bin",
        "/boot",
        "/dev",
        "/etc",
        "/lib",
        "/lib32",
        "/lib64",
        "/libx32",
        "/media",
        "/mnt",
        "/opt",
        "/proc",
        "/run",
        "/sbin",
        "/srv",
        "/sys",
        "/tmp",
        "/usr",
        "/var",
        "/snap",
        "/nix",
        "/System",
        "/Library",
        "/Applications",
        "/Volumes",
        "/private",
        "/cores",
        "/lost+found",
    }
)
DRIVE_ROOT = re.compile(r"^(?:[A-Za-z]:[\\/]*|/mnt/[A-Za-z]/*|/cygdrive/[A-Za-z]/*|/[A-Za-z]/*)$")
BLOCK_DEVICE = re.compile(
    r"^/dev/(?:sd[a-z]+\d*|hd[a-z]+\d*|vd[a-z]+\d*|xvd[a-z]+\d*|nvme\d+(?:n\d+)?(?:p\d+)?|mmcblk\d+(?:p\d+)?"
    r"|r?disk\d+(?:s\d+)?|dm-\d+|md\d+|loop\d+|mapper/.+|sr\d+|zram\d+|disk/.+)$"
)
HARMLESS_DEVICES = re.compile(r"^/dev/(?:null|zero|stdout|stderr|stdin|tty|fd/\d+|urandom|random|full)$")
WILDCARD_COMPONENT = re.compile(r"^[.*?]*\*[.*?]*$")


def has_glob(text: str) -> bool:
    return any(char in text for char in "*?[")


def critical_paths(homes: Sequence[str]) -> frozenset[str]:
    """What deleting is denied: the root, root's homes, the homes' parents, each home and its ancestors."""
    critical = {"/", *ROOT_HOMES, *HOME_PARENTS}
    for home in homes:
        critical.add(home)
        parent = os.path.dirname(home)
        while parent not in ("/", ""):
            critical.add(parent)
            parent = os.path.dirname(parent)
    return frozenset(critical)


class DenyLayer:
    """The deny layer for one path policy; ``cwd`` is the judge's (None: only known at run time)."""

    def __init__(self, paths: PathPolicy) -> None:
        self.paths = paths
        self.critical = critical_paths(paths.homes)

    def judge(self, name: str, args: Sequence[Word], cwd: str | None) -> Iterator[Finding]:
        """What running ``name`` with ``args`` destroys; ``name`` is empty when only known at run time."""
        texts = [word.text for word in args]
        if name in FORMATTERS or name.startswith("mkfs"):
            yield Finding("deny", "deny.format", f"{name} formats or partitions a disk")
        elif {text.lower() for text in texts} & FORMAT_SUBCOMMANDS.get(name, frozenset()):
            yield Finding("deny", "deny.format", f"{' '.join([name, *texts[:1]])} formats or erases a disk")
        yield from self._deletion(name, args, texts, cwd)
        yield from self._device_write(name, texts, cwd)

    def _deletion(self, name: str, args: Sequence[Word], texts: list[str], cwd: str | None) -> Iterator[Finding]:
        positionals = _positionals(args)
        if name in DELETERS:
            targets = positionals
        elif name == "mv":
            targets = positionals[:-1]
        elif name == "find" and ({"-delete"} & set(texts) or _find_runs_rm(texts)):
            targets = list(itertools.takewhile(lambda w: not w.text.startswith(("-", "(", "!")), args))
        elif name == "":
            targets = positionals  # an unknown command name: judge its operands as if it deleted
        else:
            return
        entry = removes_entry(name, texts)
        dooms = {word.text: self._doom(word, cwd, entry=entry) for word in targets}
        who = name or "this command"
        doomed = [text for text, doom in dooms.items() if doom == "deny"]
        asked = [text for text, doom in dooms.items() if doom == "ask"]
        if doomed:
            yield Finding(
                "deny", "deny.delete-root", f"{who} would delete {doomed[0]}: the root, a home or a drive root"
            )
            return
        if asked:
            yield Finding(
                "ask",
                "ask.delete-system-dir",
                f"{who} would delete {asked[0]}, a top-level system directory (read-only in a jail)",
            )
        recursive = {"-r", "-R", "--recursive"} & shape(name, texts).flags or name == "find"
        if name and recursive and any(w.dynamic for w in targets):
            yield Finding("ask", "shell.dynamic-delete", "deletes recursively a path only known at run time")

    def _doom(self, word: Word, cwd: str | None, *, entry: bool) -> Doom | None:
        """``deny`` for the root, a home or a drive root; ``ask`` for another top-level system directory."""
        text = word.text
        if DRIVE_ROOT.match(text):
            return "deny"
        if word.dynamic or (cwd is None and not text.startswith(("/", "~"))):
            return None
        lexical = self.paths.expand(text, cwd)
        candidates = (
            {lexical}
            if has_glob(lexical)
            else {lexical, entry_path(lexical, through=not entry or text.endswith(("/", "/.")))}
        )
        dooms = {self._doom_of(_emptied(candidate)) for candidate in candidates}
        return "deny" if "deny" in dooms else "ask" if "ask" in dooms else None

    def _doom_of(self, path: str) -> Doom | None:
        if _matches(path, self.critical) or _matches(os.path.dirname(path), HOME_PARENTS):
            return "deny"  # the second: /home/alice, /Users/al*, any user's home
        return "ask" if _matches(path, SYSTEM_DIRS) else None

    def _device_write(self, name: str, texts: list[str], cwd: str | None) -> Iterator[Finding]:
        positionals = [t for t in texts if not t.startswith("-")]
        if name == "dd":
            targets = [t[3:] for t in texts if t.startswith("of=")]
        elif name in ("tee", "shred", "wipe", "badblocks", "blkdiscard", "truncate"):
            targets = positionals
        elif name in ("cp", "mv", "install", "ln", "rsync", "pv", "cat") and positionals:
            targets = positionals[-1:] if name != "cat" else []
        else:
            return
        for target in targets:
            lexical = self.paths.expand(target, cwd or "/")
            if BLOCK_DEVICE.match(lexical) or BLOCK_DEVICE.match(os.path.realpath(lexical)):
                yield Finding("deny", "deny.raw-device", f"{name} writes to the raw block device {target}")
                return


REMOVERS = frozenset({"rm", "rmdir", "unlink", "trash", "trash-put"})
"""Commands that remove the directory entry an operand names: a symlink operand is the link. shred,
srm and wipe overwrite what a link names, and mv moves into a directory a destination link names:
for them (and every other command) a link is judged where it leads."""
FOLLOWING_FIND = frozenset({"-L", "-H", "-follow"})  # find follows its start points' links


def removes_entry(name: str, texts: Sequence[str]) -> bool:
    """Whether ``name``'s operands name directory entries (a link itself), not what links name."""
    if name == "find":
        return not FOLLOWING_FIND & set(texts)
    return name in REMOVERS


def _find_runs_rm(texts: list[str]) -> bool:
    return any(
        texts[i] in ("-exec", "-execdir", "-ok", "-okdir")
        and i + 1 < len(texts)
        and os.path.basename(texts[i + 1]) in DELETERS
        for i in range(len(texts))
    )


def _emptied(path: str) -> str:
    """The directory a path empties: ``/usr/*`` and ``~/.*`` delete the directory's whole content."""
    while path != "/" and WILDCARD_COMPONENT.match(os.path.basename(path)):
        path = os.path.dirname(path)
    return path


def _matches(path: str, paths: frozenset[str]) -> bool:
    """``path`` is one of ``paths``, or a glob that names one (``/u*`` is /usr)."""
    if path in paths:
        return True
    return has_glob(path) and any(fnmatch.fnmatchcase(candidate, path) for candidate in paths)


def _positionals(args: Sequence[Word]) -> list[Word]:
    out: list[Word] = []
    ended = False
    for word in args:
        if not ended and word.text == "--":
            ended = True
        elif ended or not word.text.startswith("-") or word.text == "-":
            out.append(word)
    return out
