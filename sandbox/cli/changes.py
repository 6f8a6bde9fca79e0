"""``sandbox changes``: the changesets ``copy`` and ``overlay`` runs kept (:mod:`sandbox.changes`).

``list`` the kept changesets (of one workspace), ``show`` one (its entries and a unified diff
of each file against the host file as it is now; in a repository, a summary of what changed in
``.git`` first, its files left out of the diff), ``apply`` it (flagged entries only when named
with ``--only`` or with ``--include-flagged``) or ``discard`` it. Results go to stdout, one line
per entry or one JSON object with ``--json``; a refusal is one ``sandbox: …`` line on stderr.
Names and diffs a jail chose are shown through :func:`sandbox.textsafe.printable` (one line each,
no terminal control); ``--json`` keeps each raw ``path`` (data, escaped by JSON) and the escaped
``diff`` text.

Exit statuses: 0 when done; for ``apply``, 1 when something it was asked to apply was not (held
back, a conflict, skipped, or the kept content failed its hash check); 2 when the command is
refused (an unknown id, a path not in the changeset, bad usage).
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from sandbox.cli import options
from sandbox.cli.output import EXIT_ERROR, emit, guard, say
from sandbox.textsafe import printable

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable

    from sandbox.changes import Kept
    from sandbox.cli.options import Subparsers
    from sandbox.errors import SandboxError
    from sandbox.mounts import ApplyReport

EXIT_INCOMPLETE = 1
"""``changes apply``: something asked for was held back, refused or skipped."""


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "changes",
        help="review, apply or discard the changesets copy/overlay runs kept",
        description="The changesets `sandbox run --mount copy|overlay` kept, each under an id (ch-…), "
        "until applied or discarded, or for 14 days.",
    )
    sub = parser.add_subparsers(dest="changes_command", required=True)
    listing = sub.add_parser("list", help="the kept changesets, oldest first")
    listing.add_argument("--workspace", type=Path, help="only those of this workspace")
    _finish(listing, _list)
    show = sub.add_parser("show", help="a kept changeset: its entries and a diff of each against the host now")
    show.add_argument("id")
    _finish(show, _show)
    apply = sub.add_parser(
        "apply",
        help="apply a kept changeset to its workspace",
        description="Apply the changeset's pending entries, each only where the host entry is still what was "
        "copied in. Flagged entries (git hooks and config, dotfiles, new executables, setuid…) are held back "
        "unless named with --only or allowed with --include-flagged. Exit 0 when everything asked for was "
        "applied, 1 when something was held back, conflicted or skipped, 2 when refused (e.g. an unknown id).",
    )
    apply.add_argument("id")
    apply.add_argument("--only", nargs="+", metavar="PATH", help="apply only these paths (flagged ones included)")
    apply.add_argument("--include-flagged", action="store_true", help="apply flagged entries too")
    _finish(apply, _apply)
    discard = sub.add_parser("discard", help="remove a kept changeset without applying it")
    discard.add_argument("id")
    discard.set_defaults(func=guard(_discard, EXIT_ERROR))
    recover = sub.add_parser(
        "recover",
        help="finish or undo an apply that was interrupted (a crash, a kill)",
        description="An apply is journalled: killed before its commit point it is undone, after it finished. "
        "Any later sandbox command on the workspace does this by itself; this does it now. Exit 1 when a path "
        "could not be brought to either state (it is named).",
    )
    recover.add_argument("--workspace", type=Path, help="only this workspace (default: every one with a journal)")
    _finish(recover, _recover)


def _finish(parser: argparse.ArgumentParser, handler: Callable[[argparse.Namespace], int]) -> None:
    options.add_json(parser, help="one JSON object on stdout")
    parser.set_defaults(func=guard(handler, EXIT_ERROR, answer=_json_refusal))


def _json_refusal(args: argparse.Namespace, error: SandboxError) -> None:
    if args.json:
        emit({"error": error.to_dict()})


def _list(args: argparse.Namespace) -> int:
    from sandbox import changes

    found = changes.listing(args.workspace)
    if args.json:
        emit({"changesets": [kept.summary() for kept in found]})
        return 0
    for kept in found:
        print(_line(kept))
    return 0


def _line(kept: Kept) -> str:
    counts = kept.summary()["counts"]
    tally = " ".join(f"{counts[k]} {k}" for k in ("added", "modified", "deleted", "flagged") if counts[k])
    where = printable(str(kept.workspace))
    return f"{kept.id}  {kept.created:%Y-%m-%d %H:%M}  {kept.state:<7}  {where}  ({tally})"


def _show(args: argparse.Namespace) -> int:
    from sandbox import changes

    kept = changes.load(args.id)
    if args.json:
        emit({**kept.to_dict(), "git_lines": kept.git_lines(), "diff": kept.diff()})
        return 0
    print(_line(kept))
    print(f"profile {kept.profile}, backend {kept.backend}, kept by {kept.source}\n")
    for line in kept.git_lines():  # a repository's .git entries: summed up, left out of the diff
        print(line)
    sys.stdout.write(kept.diff())
    return 0


def _apply(args: argparse.Namespace) -> int:
    import anyio

    from sandbox import changes
    from sandbox.errors import Conflict

    kept = changes.load(args.id)
    try:
        report = anyio.run(functools.partial(kept.apply, args.only, include_flagged=args.include_flagged))
    except Conflict as exc:  # the kept content failed its check, or another apply holds it
        say(str(exc))
        _json_refusal(args, exc)
        return EXIT_INCOMPLETE
    code = EXIT_INCOMPLETE if report.conflicts or report.held_back or report.skipped else 0
    if args.json:
        emit({"id": kept.id, "state": kept.state, **report.to_dict(), "exit_status": code})
    else:
        _print_report(report, grouped=kept.git is not None)
        if report.held_back:
            say(f"flagged entries need consent: sandbox changes apply {kept.id} --include-flagged (or --only PATH)")
    return code


def _print_report(report: ApplyReport, *, grouped: bool) -> None:
    from sandbox.changes import held_back_line
    from sandbox.gitreview import in_git

    git = [path for path in report.applied if grouped and in_git(path)]
    for path in report.applied:
        if path not in git:
            print(f"applied {printable(path)}")
    if git:  # a repository's .git entries: one group, one line (--json lists each)
        print(f"applied .git (the git group, {len(git)} entries)")
    for conflict in report.conflicts:
        print(f"CONFLICT {printable(conflict['path'])}: {printable(conflict['reason'])}")
    for held in report.held_back:
        print(f"held back {held_back_line(held)}")
    for skipped in report.skipped:
        print(f"skipped {printable(skipped['path'])}: {printable(skipped['reason'])}")


def _recover(args: argparse.Namespace) -> int:
    from sandbox import journal

    workspaces = [args.workspace] if args.workspace else journal.pending()
    reports = [journal.recover(workspace) for workspace in workspaces]
    if args.json:
        emit({"recovered": [report.to_dict() for report in reports]})
    else:
        for report in reports:
            print(f"{report.workspace}: {report.action} ({report.steps} steps)")
            for problem in report.problems:
                say(printable(f"{problem.get('path', '?')}: {problem.get('reason', problem)}"))
    return EXIT_INCOMPLETE if any(report.problems for report in reports) else 0


def _discard(args: argparse.Namespace) -> int:
    from sandbox import changes

    changes.load(args.id).discard()
    say(f"discarded {args.id}")
    return 0
