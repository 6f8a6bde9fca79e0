"""``sandbox compare``: one command under every backend x mount strategy, side by side.

Exit status: 0 when every cell ran or was skipped for a stated reason (a command failing in a
cell is data, not an error); 1 when a cell could not run (the sandbox refused or broke); 2 when
a backend named in ``--backends`` is unavailable here; 125 on bad input (unknown backend or
mount, missing workspace, no command). Progress goes to stderr (a line as each cell starts and
ends, with its elapsed time, and a throttled one while a long cell runs), the table, or with
``--json`` the report itself, to stdout; the engine and the renderings are :mod:`sandbox.compare`.
``--network``/``--allow-host``/``--allow-index`` and ``--image`` are ``sandbox run``'s own flags
(:mod:`sandbox.cli.options`), applied to every cell.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from sandbox.backends import DEFAULT_COMPARE_REPEAT
from sandbox.cli import options
from sandbox.cli.output import emit, guard, say
from sandbox.vocabulary import EXIT_SANDBOX, MOUNT_STRATEGIES

if TYPE_CHECKING:
    import argparse

    from sandbox.cli.options import Subparsers
    from sandbox.errors import SandboxError

DEFAULT_REPORT = Path("sandbox-compare")
WHO = "sandbox compare"


def register(sub: Subparsers) -> None:
    cmd = sub.add_parser(
        "compare",
        help="run one command under each backend x mount strategy and compare cost and protection",
        description="Run ARGV on fresh copies of the workspace under each backend and mount strategy; "
        "print a table and write report.json, report.md, chart.svg and table.txt.",
    )
    cmd.add_argument("--backends", help="comma-separated, e.g. bwrap,docker (default: every available one)")
    cmd.add_argument("--mounts", help=f"comma-separated (default: {','.join(MOUNT_STRATEGIES)})")
    options.add_workspace(cmd)
    cmd.add_argument(
        "--repeat",
        default=str(DEFAULT_COMPARE_REPEAT),
        help=f"runs per cell, each on a fresh copy in a fresh jail (default: {DEFAULT_COMPARE_REPEAT})",
    )
    cmd.add_argument(
        "--report",
        type=Path,
        default=DEFAULT_REPORT,
        help=f"directory for report.json, report.md, chart.svg, table.txt (default: ./{DEFAULT_REPORT})",
    )
    options.add_profile(cmd)
    options.add_network(cmd)
    options.add_image(cmd)
    options.add_json(cmd, help="print report.json on stdout instead of the table (progress stays on stderr)")
    cmd.add_argument(
        "--timeout", help="seconds per run, 1 to the profile's timeouts.max_s (default: its timeouts.default_s)"
    )
    cmd.add_argument(
        "--baseline",
        action="store_true",
        help="also add a host/baseline cell that runs the command on the host, unsandboxed, to measure its own "
        "time: only for commands you trust (each run on a fresh copy of the workspace); every cell gets a "
        "'vs host' ratio of wall times",
    )
    options.add_argv(cmd)
    cmd.set_defaults(func=guard(cmd_compare, EXIT_SANDBOX, who=WHO, answer=_json_refusal))


def _json_refusal(args: argparse.Namespace, error: SandboxError) -> None:
    """A ``--json`` reader gets its one object even when nothing ran: the error, as ``sandbox run`` does."""
    if args.json:
        emit({"error": error.to_dict(), "exit_code": EXIT_SANDBOX})


def _progress(line: str) -> None:
    say(line, who=WHO)


def cmd_compare(args: argparse.Namespace) -> int:
    import anyio

    from sandbox import compare

    plan = compare.make_plan(
        options.command(args.argv),
        args.workspace,
        backends=args.backends,
        mounts=args.mounts,
        repeat=args.repeat,
        profile=args.profile,
        timeout=args.timeout,
        baseline=args.baseline,
        network=args.network,
        allow_hosts=args.allow_host,
        allow_indexes=args.allow_index,
        image=args.image,
    )
    cells = len(plan.backends) * len(plan.mounts)
    host = " + an unsandboxed baseline on the host" if plan.baseline else ""
    _progress(
        f"{cells} cells x {plan.repeat} run(s) + a destructive probe each{host}, on fresh copies of {plan.workspace}"
    )
    report = anyio.run(compare.compare, plan, _progress)
    paths = compare.write(report, args.report)
    sys.stdout.write(json.dumps(report.to_dict(), indent=2) + "\n" if args.json else compare.table(report))
    sys.stdout.flush()
    _progress("wrote " + ", ".join(str(p) for p in paths))
    code = compare.exit_status(report)
    if code == 2:
        _progress("a backend named in --backends is unavailable here (see the table)")
    elif code == 1:
        _progress("some cells could not run (see the table)")
    return code
