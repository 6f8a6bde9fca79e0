"""``sandbox snapshot``: the session snapshots kept in the data directory (:mod:`sandbox.snapshots`).

``list`` the snapshots (of one workspace), oldest first; ``show`` one (what ``list`` says of it,
then its lineage and settings, then each path it holds: written, deleted, or a directory
replaced); ``diff`` two snapshots of one workspace (each path that holds differently, with what
it is in each); ``discard`` one. Snapshots are taken, restored and forked from by a session
(``Sandbox.snapshot``, ``session.snapshot``, the ``Snapshot`` tool), never by this command.
Results go to stdout, one line per entry or one JSON object with ``--json``; a refusal is one
``sandbox: …`` line on stderr (and ``{"error": {code, message, data}}`` on stdout with
``--json``). Names a jail chose are shown through :func:`sandbox.textsafe.printable` (one line
each, no terminal control); ``--json`` keeps each raw path.

Exit statuses: 0 when done; 2 when the command is refused (an unknown or malformed id, snapshots
of different workspaces, bad usage); 141 when the reader (a pager) quit before the end.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from sandbox.cli.output import emit, json_command, reader_gone, say
from sandbox.textsafe import printable

if TYPE_CHECKING:
    import argparse

    from sandbox.cli.options import Subparsers
    from sandbox.snapshots import Snapshot


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "snapshot",
        help="list, show, compare or discard the session snapshots kept",
        description="The session snapshots (snap-…) sessions took (Sandbox.snapshot, session.snapshot, the "
        "Snapshot tool), each a session's whole file state kept until discarded or 7 days after it was last "
        "taken, restored or forked from; at most limits.snapshots a workspace and limits.snapshot_bytes in all.",
    )
    sub = parser.add_subparsers(dest="snapshot_command", required=True)
    listing = sub.add_parser("list", help="the snapshots kept, oldest first")
    listing.add_argument("--workspace", type=Path, help="only those of this workspace")
    json_command(listing, _list)
    show = sub.add_parser(
        "show",
        help="a snapshot: what list says of it, its lineage and settings, then each path it holds",
        description="What `list` says of the snapshot, its lineage, parent and settings, then each path it "
        "holds over its workspace: written (a file or link of the snapshot's), deleted, or replaced (a directory "
        "whose host content it hides).",
    )
    show.add_argument("id")
    json_command(show, _show)
    diff = sub.add_parser(
        "diff",
        help="how snapshot B's files differ from snapshot A's (both of one workspace)",
        description="Each path that holds differently in B than in A, with what it is in each: host (the "
        "workspace's own), deleted, file sha256:…, symlink -> …, dir (replaced).",
    )
    diff.add_argument("a", metavar="A")
    diff.add_argument("b", metavar="B")
    json_command(diff, _diff)
    discard = sub.add_parser(
        "discard",
        help="remove a snapshot",
        description="Remove the snapshot ID from the store. A session that was restored or forked from it "
        "keeps its files; it can no longer go back to it.",
    )
    discard.add_argument("id")
    json_command(discard, _discard)


def _list(args: argparse.Namespace) -> int:
    from sandbox import snapshots

    found = snapshots.listing(args.workspace)
    if args.json:
        emit({"snapshots": [snap.describe() for snap in found]})
        return 0
    return _printed([_line(snap) for snap in found])


def _line(snap: Snapshot) -> str:
    from sandbox.changesummary import human_size

    info = snap.describe()
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(snap.created))
    tally = f"{info['changed']} changed, {info['deleted']} deleted, {human_size(info['bytes'])}"
    where = printable(snap.workspace)
    return f"{snap.id}  {when}  {snap.kind:<6}  {snap.backend}/{snap.mount}  {where}  ({tally})"


def _paths(snap: Snapshot) -> dict[str, list[str]]:
    return {"present": snap.delta.present, "deleted": snap.delta.deleted, "replaced": snap.delta.replaced}


def _show(args: argparse.Namespace) -> int:
    from sandbox import snapshots

    snap = snapshots.read(args.id)
    if args.json:
        emit({**snap.describe(), "paths": _paths(snap)})
        return 0
    settings = ", ".join(f"{key} {value}" for key, value in sorted(snap.settings.items())) or "none"
    lines = [
        _line(snap),
        f"lineage {snap.lineage}, taken by session {snap.session_id}, parent {snap.parent or 'none'}",
        f"settings: {settings}; took {snap.took_ms} ms",
        "",
    ]
    paths = _paths(snap)
    shown = {"present": "written ", "deleted": "deleted ", "replaced": "replaced"}
    entries = sorted((rel, what) for what, rels in paths.items() for rel in rels)
    lines += [f"{shown[what]}  {printable(rel)}{'/' if what == 'replaced' else ''}" for rel, what in entries]
    return _printed(lines)


def _diff(args: argparse.Namespace) -> int:
    from sandbox import snapshots

    differences = snapshots.diff(args.a, args.b)
    if args.json:
        emit({"a": args.a, "b": args.b, "paths": differences})
        return 0
    lines = [f"{printable(d['path'])}  {printable(d['a'])} -> {printable(d['b'])}" for d in differences]
    if not differences:
        say(f"{args.a} and {args.b} show the same files")
    return _printed(lines)


def _discard(args: argparse.Namespace) -> int:
    from sandbox import snapshots

    gone = snapshots.discard(args.id)
    if args.json:
        emit({"discarded": [gone.id]})
    say(f"discarded {gone.id}")
    return 0


def _printed(lines: list[str]) -> int:
    """``lines`` on stdout; :data:`~sandbox.cli.output.EXIT_SIGPIPE` when its reader went away first."""
    try:
        for line in lines:
            print(line)
        sys.stdout.flush()
    except BrokenPipeError:  # a pager quit early: quietly, as a Unix tool ends when its reader has gone
        return reader_gone()
    return 0
