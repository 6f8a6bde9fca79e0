"""``sandbox compare``: one command under every backend x mount strategy, side by side.

Exit status: 0 when every cell ran or was skipped for a stated reason (a command failing in a
cell is data, not an error); 1 when a cell could not run (the sandbox refused or broke); 2 when
a backend named in ``--backends`` is unavailable here; 125 on bad input (unknown backend or
mount, missing workspace, no command). Progress goes to stderr, the table to stdout.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from sandbox.backends import DEFAULT_COMPARE_REPEAT, MOUNT_STRATEGIES
from sandbox.errors import InvalidArgument, SandboxError

if TYPE_CHECKING:
    from sandbox.cli import Subparsers

EXIT_SANDBOX = 125
DEFAULT_REPORT = Path("sandbox-compare")


def register(sub: Subparsers) -> None:
    cmd = sub.add_parser(
        "compare",
        help="run one command under each backend x mount strategy and compare cost and protection",
        description="Run ARGV on fresh copies of the workspace under each backend and mount strategy; "
        "print a table and write report.json, report.md, chart.svg and table.txt.",
    )
    cmd.add_argument("--backends", help="comma-separated, e.g. bwrap,docker (default: every available one)")
    cmd.add_argument("--mounts", help=f"comma-separated (default: {','.join(MOUNT_STRATEGIES)})")
    cmd.add_argument("--workspace", type=Path, default=None, help="default: the current directory")
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
    cmd.add_argument("--profile", help="a shipped profile name or a TOML file (default: default)")
    cmd.add_argument(
        "--timeout", help="seconds per run, 1 to the profile's timeouts.max_s (default: its timeouts.default_s)"
    )
    cmd.add_argument("argv", nargs=argparse.REMAINDER, help="-- the command and its arguments")
    cmd.set_defaults(func=cmd_compare)


def _say(line: str) -> None:
    print(f"sandbox compare: {line}", file=sys.stderr, flush=True)


def cmd_compare(args: argparse.Namespace) -> int:
    import anyio

    from sandbox import compare

    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    try:
        plan = compare.make_plan(
            argv,
            args.workspace,
            backends=args.backends,
            mounts=args.mounts,
            repeat=args.repeat,
            profile=args.profile,
            timeout=args.timeout,
        )
    except InvalidArgument as exc:
        _say(str(exc))
        return EXIT_SANDBOX
    cells = len(plan.backends) * len(plan.mounts)
    _say(f"{cells} cells x {plan.repeat} run(s) + a destructive probe each, on fresh copies of {plan.workspace}")
    try:
        report = anyio.run(compare.compare, plan, _say)
        paths = compare.write(report, args.report)
    except SandboxError as exc:
        _say(str(exc))
        return EXIT_SANDBOX
    sys.stdout.write(compare.table(report))
    sys.stdout.flush()
    _say("wrote " + ", ".join(str(p) for p in paths))
    code = compare.exit_status(report)
    if code == 2:
        _say("a backend named in --backends is unavailable here (see the table)")
    elif code == 1:
        _say("some cells could not run (see the table)")
    return code
