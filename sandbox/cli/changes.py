"""``sandbox changes``: the changesets ``copy`` and ``overlay`` runs kept (:mod:`sandbox.changes`).

``list`` the kept changesets (of one workspace), ``show`` one (a total line and a summary
(:mod:`sandbox.changesummary`: ``.git``, environment directories and ignored noise summed up,
flagged entries named), then a unified diff of each work file against the host file as it is
now; ``--stat``, path filters and ``--flagged`` choose), ``apply`` it (flagged entries only when
named with ``--only`` or with ``--include-flagged``), ``discard`` it (or ``--all``), or ``prune``
the store (applied and old changesets: :func:`sandbox.changes.prune`). Results go to stdout, one line
per entry or one JSON object with ``--json``; a refusal is one ``sandbox: …`` line on stderr.
Names and diffs a jail chose are shown through :func:`sandbox.textsafe.printable` (one line each,
no terminal control); ``--json`` keeps each raw ``path`` (data, escaped by JSON) and the escaped
``diff`` text.

Exit statuses: 0 when done; for ``apply``, 1 when something it was asked to apply was not (held
back, a conflict, skipped, or the kept content failed its hash check); 2 when the command is
refused (an unknown id, a path not in the changeset, bad usage); for ``show``, 141 when its
reader (a pager) quit before the end.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sandbox.cli.output import emit, json_command, json_refusal, reader_gone, say
from sandbox.textsafe import printable

if TYPE_CHECKING:
    import argparse

    from sandbox.changes import Kept
    from sandbox.cli.options import Subparsers
    from sandbox.mounts import ApplyReport, Change

EXIT_INCOMPLETE = 1
"""``changes apply``: something asked for was held back, refused or skipped."""


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "changes",
        help="review, apply or discard the changesets copy/overlay runs kept",
        description="The changesets `sandbox run --mount copy|overlay` kept, each under an id (ch-…), until "
        "discarded, a day after they were wholly applied, or for 14 days; past limits.kept_changes a new one "
        "prunes applied, then the oldest (`sandbox changes prune` does it now).",
    )
    sub = parser.add_subparsers(dest="changes_command", required=True)
    listing = sub.add_parser("list", help="the kept changesets, oldest first")
    listing.add_argument("--workspace", type=Path, help="only those of this workspace")
    json_command(listing, _list)
    _register_show(sub)
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
    apply.add_argument(
        "--include-environment",
        action="store_true",
        help="apply the environment directories too (.venv, node_modules…: the profile's mount.environment), "
        "flagged entries in them included; otherwise each is held back unless named with --only DIR",
    )
    json_command(apply, _apply)
    discard = sub.add_parser(
        "discard",
        help="remove a kept changeset (or, with --all, every one) without applying it",
        description="Remove the kept changeset ID, or with --all every kept changeset (of --workspace DIR only, "
        "when given), without applying anything.",
    )
    discard.add_argument("id", nargs="?")
    discard.add_argument("--all", action="store_true", help="every kept changeset (see --workspace)")
    discard.add_argument("--workspace", type=Path, help="with --all: only those of this workspace")
    json_command(discard, _discard)
    _register_prune(sub)
    recover = sub.add_parser(
        "recover",
        help="finish or undo an apply that was interrupted (a crash, a kill)",
        description="An apply is journalled: killed before its commit point it is undone, after it finished. "
        "Any later sandbox command on the workspace does this by itself; this does it now. Exit 1 when a path "
        "could not be brought to either state (it is named).",
    )
    recover.add_argument("--workspace", type=Path, help="only this workspace (default: every one with a journal)")
    json_command(recover, _recover)


def _register_show(sub: Any) -> None:
    show = sub.add_parser(
        "show",
        help="a kept changeset: a summary, then its entries and a diff of each against the host now",
        description="Without a filter: a total line and a summary (environment directories and ignored noise "
        "in one line each, flagged entries named), then the diff of the work and of the flagged entries. "
        "PATH or --only PATH (a directory names everything under it) and --flagged choose what is diffed; "
        "--stat gives one line per entry instead of its diff.",
    )
    show.add_argument("id")
    show.add_argument("paths", nargs="*", metavar="PATH", help="only these paths (a directory: all under it)")
    show.add_argument("--only", nargs="+", metavar="PATH", default=[], help="the same as PATH arguments")
    show.add_argument("--flagged", action="store_true", help="only the flagged entries (and the never applicable)")
    show.add_argument("--stat", action="store_true", help="one line per entry: +/- lines for text, sizes otherwise")
    json_command(show, _show)


def _register_prune(sub: Any) -> None:
    prune = sub.add_parser(
        "prune",
        help="remove kept changesets that are done with: applied ones, old ones",
        description="Without options, what the store does by itself on each use: remove changesets applied "
        "more than a day ago and any kept more than 14 days. --all-applied removes every applied one now; "
        "--older-than DAYS every one (applied or not) kept more than DAYS days ago.",
    )
    prune.add_argument("--all-applied", action="store_true", help="every applied changeset, however recent")
    prune.add_argument("--older-than", type=float, metavar="DAYS", help="every changeset kept more than DAYS ago")
    json_command(prune, _prune)


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
    from sandbox import changes, changesummary

    kept = changes.load(args.id)
    filters = [*args.paths, *args.only]
    chosen = _chosen(kept, filters, args.flagged)
    if args.json:  # the shape of old, fields added: a filter narrows the diff to what it chose
        diff = kept.diff([c.path for c in chosen], exact=True) if filters or args.flagged else kept.diff()
        shown = {**kept.to_dict(), "git_lines": kept.git_lines(), "diff": diff}
        shown["summary"] = [changesummary.total_line(kept.changeset.changes), *_summary(kept)]
        if args.stat:
            shown["stat"] = changesummary.stat_lines(chosen, kept.workspace, kept.path / "tree")
        emit(shown)
        return 0
    try:
        _page(kept, chosen, summary=not (filters or args.flagged), stat=args.stat)
        sys.stdout.flush()
    except BrokenPipeError:  # a pager quit early: quietly, as a Unix tool ends when its reader has gone
        return reader_gone()
    return 0


def _page(kept: Kept, chosen: list[Change], *, summary: bool, stat: bool) -> None:
    from sandbox import changesummary

    print(_line(kept))
    print(f"profile {kept.profile}, backend {kept.backend}, kept by {kept.source}")
    if summary:
        print(changesummary.total_line(kept.changeset.changes))
        for line in _summary(kept):
            print(f"  {line}")
    print()
    if stat:
        for line in changesummary.stat_lines(chosen, kept.workspace, kept.path / "tree"):
            print(line)
        return
    sys.stdout.write(kept.diff([c.path for c in chosen], exact=True))


def _summary(kept: Kept) -> list[str]:
    from sandbox import changesummary
    from sandbox.mounts.gitreview import in_git

    group = {e.change.path for e in kept.entries if in_git(e.change.path)} if kept.git is not None else set()
    rules = changesummary.Rules.of_kept(kept)
    # The git summary whole (this is where a run's capped one points), then the rest summed up.
    summed = changesummary.summary_lines(kept.changeset.changes, rules, git_group=group, changeset_id=kept.id)
    return [*kept.git_lines(), *summed]


def _chosen(kept: Kept, filters: list[str], flagged: bool) -> list[Change]:
    """What ``show`` details: the entries under the filters (all of them, environment included),
    else the work and every flagged entry outside the summed-up groups (``.git``, environment)."""
    from sandbox import changesummary
    from sandbox.errors import InvalidArgument
    from sandbox.mounts.gitreview import in_git

    entries = kept.changeset.changes
    if filters:
        wanted = [f.strip("/") or "." for f in filters]
        unknown = [f for f in wanted if not any(_under(c.path, f) for c in entries)]
        if unknown:
            raise InvalidArgument(f"not in changeset {kept.id}: {', '.join(unknown)}", paths=unknown)
        entries = [c for c in entries if any(_under(c.path, f) for f in wanted)]
    if flagged:
        return [c for c in entries if changesummary.notable(c)]
    if filters:
        return entries
    git = {c.path for c in entries if in_git(c.path)} if kept.git is not None else set()
    groups = changesummary.classify(entries, changesummary.Rules.of_kept(kept), git)
    return [*groups.work, *(c for c in groups.ignored if changesummary.notable(c))]


def _under(path: str, prefix: str) -> bool:
    return prefix == "." or path == prefix or path.startswith(f"{prefix}/")


def _apply(args: argparse.Namespace) -> int:
    import anyio

    from sandbox import changes
    from sandbox.errors import Conflict

    kept = changes.load(args.id)
    try:
        consent = {"include_flagged": args.include_flagged, "include_environment": args.include_environment}
        report = anyio.run(functools.partial(kept.apply, args.only, **consent))
    except Conflict as exc:  # the kept content failed its check, or another apply holds it
        say(str(exc))
        json_refusal(args, exc)
        return EXIT_INCOMPLETE
    code = EXIT_INCOMPLETE if report.conflicts or report.held_back or report.skipped else 0
    if args.json:
        emit({"id": kept.id, "state": kept.state, **report.to_dict(), "exit_status": code})
    else:
        _print_report(report, grouped=kept.git is not None, environment=kept.environment)
        if any(held.get("group") != "environment" for held in report.held_back):
            say(f"flagged entries need consent: sandbox changes apply {kept.id} --include-flagged (or --only PATH)")
        if any(held.get("group") == "environment" for held in report.held_back):
            say(
                f"environment directories need consent: sandbox changes apply {kept.id} --only DIR "
                "(or --include-environment)"
            )
    return code


def _print_report(report: ApplyReport, *, grouped: bool, environment: list[str] | None = None) -> None:
    from sandbox.changes import held_back_line
    from sandbox.mounts import envdirs
    from sandbox.mounts.gitreview import in_git

    git = [path for path in report.applied if grouped and in_git(path)]
    env = envdirs.groups(report.applied, environment or [])
    in_env = {path for paths in env.values() for path in paths}
    for path in report.applied:
        if path not in git and path not in in_env:
            print(f"applied {printable(path)}")
    if git:  # a repository's .git entries: one group, one line (--json lists each)
        print(f"applied .git (the git group, {len(git)} entries)")
    for root, paths in sorted(env.items()):  # an environment directory: one line too
        print(f"applied {printable(root)} (environment, {len(paths)} entries)")
    for conflict in report.conflicts:
        print(f"CONFLICT {printable(conflict['path'])}: {printable(conflict['reason'])}")
    for held in report.held_back:
        print(f"held back {held_back_line(held)}")
    for skipped in report.skipped:
        print(f"skipped {printable(skipped['path'])}: {printable(skipped['reason'])}")


def _recover(args: argparse.Namespace) -> int:
    from sandbox.mounts import journal

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
    from sandbox.errors import InvalidArgument

    if bool(args.id) == bool(args.all) or (args.workspace and not args.all):
        raise InvalidArgument("name one changeset (sandbox changes discard ID) or --all [--workspace DIR]")
    if not args.all:
        changes.load(args.id).discard()
        if args.json:
            emit({"discarded": [args.id]})
        say(f"discarded {args.id}")
        return 0
    gone = changes.discard_all(args.workspace)
    if args.json:
        emit({"discarded": gone})
    else:
        named = f": {', '.join(gone)}" if gone else ""
        say(f"discarded {len(gone)} kept changeset{'' if len(gone) == 1 else 's'}{named}")
    return 0


def _prune(args: argparse.Namespace) -> int:
    from sandbox import changes
    from sandbox.changesummary import human_size

    pruned = changes.prune(all_applied=args.all_applied, older_than_days=args.older_than)
    if args.json:
        emit({"pruned": [p.to_dict() for p in pruned], "freed_bytes": sum(p.bytes for p in pruned)})
        return 0
    for p in pruned:
        print(f"pruned {p.id}  {p.state:<7}  kept {p.created:%Y-%m-%d %H:%M}  {human_size(p.bytes)}  ({p.why})")
    print(f"{len(pruned)} pruned, {human_size(sum(p.bytes for p in pruned))} freed")
    return 0
