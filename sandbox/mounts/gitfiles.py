"""A git repository read as plain files, never with git: refs, ``HEAD``, commits, the index.

The private copy's ``.git`` was written by an untrusted command, and git itself would obey it, so
nothing here runs git or follows a link the jail made: a file is read only when it is a regular
file no larger than a cap; refs, ``HEAD`` and ``packed-refs`` as text; a commit by zlib from its
loose object, inflated no further than its headers and subject; the index's v2/v3 entries as
(mode, object id) per path. Every string taken from a file goes through :func:`escape`, so none
can carry a terminal control sequence. Apart from :mod:`sandbox.mounts.gitreview`, which summarises
what changed, because :mod:`sandbox.mounts.gitobeyed` reads the host's repository the same way.
"""

from __future__ import annotations

import os
import re
import stat
import zlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

    from sandbox.mounts.changeset import Change

OBJECT_ID = re.compile(rb"^[0-9a-f]{40}$|^[0-9a-f]{64}$")
READ_MAX = 1 << 20  # a ref, config or compressed commit larger than this is not read
LARGE_MAX = 1 << 26  # the index and packed-refs of a large repository
_COMMIT_MAX = 1 << 16  # of a commit object, only this much is inflated: headers and subject


class View:
    """The repository as files: the host's, or the host's overlaid with the kept changes."""

    def __init__(self, workspace: Path, kept: Path | None = None, changes: Iterable[Change] = ()) -> None:
        self.workspace = workspace
        self.kept = kept
        self.changed = {c.path: c for c in changes}

    def read(self, rel: str, limit: int = READ_MAX) -> bytes | None:
        change = self.changed.get(rel)
        if change is None:
            return read_file(self.workspace / rel, limit)
        if self.kept is None or change.status == "deleted" or change.kind != "file":
            return None
        return read_file(self.kept / rel, limit)

    def files(self, rel: str) -> set[str]:
        """The regular files below ``rel``."""
        found = set(host_files(self.workspace, rel))
        for path, change in self.changed.items():
            if path.startswith(f"{rel}/"):
                present = change.status != "deleted" and change.kind == "file"
                (found.add if present else found.discard)(path)
        return found

    def has_object(self, oid: str) -> bool:
        return self.read(f".git/objects/{oid[:2]}/{oid[2:]}") is not None

    def refs(self) -> dict[str, str]:
        """Every ref: ``packed-refs`` overridden by the loose ones (ids, or ``ref: …`` when symbolic)."""
        found = _packed_refs(self.read(".git/packed-refs", LARGE_MAX) or b"")
        for path in sorted(self.files(".git/refs")):
            value = _ref_value(self.read(path))
            if value is not None:
                found[path[len(".git/") :]] = value
        return found


def read_file(path: Path, limit: int) -> bytes | None:
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


def host_files(workspace: Path, rel: str) -> Iterator[str]:
    top = workspace / rel
    for dirpath, _dirs, files in os.walk(top):  # os.walk follows no symlinked directory
        base = PurePosixPath(rel) / PurePosixPath(Path(dirpath).relative_to(top).as_posix())
        for name in files:
            yield str(base / name)


def _ref_value(data: bytes | None) -> str | None:
    line = (data or b"").strip()
    if OBJECT_ID.match(line):
        return line.decode()
    if line.startswith(b"ref: "):
        return escape(line.decode("utf-8", "replace"))
    return None


def _packed_refs(data: bytes) -> dict[str, str]:
    found = {}
    for line in data.splitlines():
        oid, _, name = line.partition(b" ")
        if OBJECT_ID.match(oid) and name.startswith(b"refs/"):
            found[escape(name.decode("utf-8", "replace"))] = oid.decode()
    return found


def shown_text(data: bytes | None) -> str:
    return escape((data or b"").decode("utf-8", "replace").strip()) if data is not None else "(none)"


# -- commits ------------------------------------------------------------------------------------------


@dataclass
class Commit:
    oid: str
    parents: list[str]
    author: str
    subject: str

    def shown(self) -> dict[str, str]:
        return {"id": self.oid, "subject": self.subject, "author": self.author}


def read_commit(view: View, oid: str) -> Commit | None:
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


def _parse_commit(oid: str, body: bytes) -> Commit:
    head, _, message = body.partition(b"\n\n")
    parents, author = [], ""
    for line in head.split(b"\n"):
        name, _, value = line.partition(b" ")
        if name == b"parent" and OBJECT_ID.match(value):
            parents.append(value.decode())
        elif name == b"author":
            author = escape(re.sub(rb" \d+ [+-]\d{4}$", b"", value).decode("utf-8", "replace"))
    subject = " ".join(message.split(b"\n\n", 1)[0].decode("utf-8", "replace").split())
    return Commit(oid, parents, author, escape(subject[:100]))


# -- the index ----------------------------------------------------------------------------------------


def index_difference(old: View, new: View) -> int | None:
    """How many paths differ (mode or blob) between the two indexes; ``None`` if one is not v2/v3."""
    before = _index_entries(old.read(".git/index", LARGE_MAX))
    after = _index_entries(new.read(".git/index", LARGE_MAX))
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


# -- strings from the jail ----------------------------------------------------------------------------


def escape(text: str) -> str:
    """``text`` with every unprintable character (terminal controls among them) escaped."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
