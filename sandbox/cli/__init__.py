"""The ``sandbox`` command: its parser, :func:`main`, and :func:`entry`, the console script.

``sandbox run`` is a contract scripts and CI depend on: the command's own exit status, 128+N
for signal N, 124 on timeout, 125 when the sandbox could not start or refused (one line on
stderr), 127 when the command is not found in the jail and 126 when it cannot be executed there
(one line naming it), 141 when our stdout was closed (as SIGPIPE ends a Unix tool); with
``--json`` exactly one JSON object on stdout at the end, naming the network mode and every limit
in force. Our stdin is the command's (streamed; a terminal is not forwarded). A flag never
overrides a guarantee the profile requires: ``--network host`` under a profile that requires
``net-none`` is refused with 125, and a bad value is blamed on the flag that gave it.

One module per command family (:mod:`~sandbox.cli.run` with its quick path
:mod:`~sandbox.cli.launch`, :mod:`~sandbox.cli.compare`, :mod:`~sandbox.cli.policy`,
:mod:`~sandbox.cli.tools`, :mod:`~sandbox.cli.image`, :mod:`~sandbox.cli.inventory`), each
registering its parsers with every handler behind :func:`sandbox.cli.output.guard`, the one
place a refusal becomes a ``sandbox: …`` line and an exit status.

Start-up is a product figure (``sandbox --version``, every ``sandbox run``): this package's
modules import only the standard library at the top; each command imports what it uses
(pydantic, anyio, the backends, the policy layer) when it runs.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import typing

from sandbox import __version__
from sandbox.cli import run
from sandbox.cli.output import EXIT_ERROR, reader_gone, say
from sandbox.errors import InvalidArgument
from sandbox.vocabulary import EXIT_SANDBOX

if typing.TYPE_CHECKING:
    from sandbox.cli.options import Subparsers

__all__ = ["build_parser", "entry", "main"]


class _Parser(argparse.ArgumentParser):
    """Bad usage is a structured INVALID_ARGUMENT, so ``sandbox run`` can answer it with 125."""

    def error(self, message: str) -> typing.NoReturn:
        command = self.prog.removeprefix("sandbox").strip()  # say() already writes "sandbox: "
        raise InvalidArgument(f"{command}: {message}" if command else message)

    def _get_formatter(self) -> argparse.HelpFormatter:
        # argparse asks shutil for the terminal's width at every add_argument: shutil (with the
        # compressors it imports) would be a tenth of a short run's imports.
        return self.formatter_class(prog=self.prog, width=_columns() - 2)  # type: ignore[call-arg]


def _columns() -> int:
    """``shutil.get_terminal_size().columns``: $COLUMNS, else our stdout's terminal, else 80."""
    with contextlib.suppress(KeyError, ValueError):
        if (columns := int(os.environ["COLUMNS"])) > 0:
            return columns
    with contextlib.suppress(AttributeError, ValueError, OSError):
        return os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
    return 80


def build_parser(only_run: bool = False) -> argparse.ArgumentParser:
    """The whole parser; ``only_run``: just ``sandbox run``'s, which parses its arguments the same
    (building every subcommand's parser is a tenth of a short run)."""
    parser = _Parser(prog="sandbox", description="Run agent tools under an OS-level boundary.")
    parser.add_argument("--version", action="version", version=f"sandbox {__version__}")
    sub = typing.cast("Subparsers", parser.add_subparsers(dest="command", required=True))
    run.register(sub)
    if only_run:
        return parser
    # Imported here: a quick ``sandbox run`` loads none of the other commands' modules.
    from sandbox.cli import changes, compare, image, inventory, mcp, policy, shells, snapshots, tools

    inventory.register(sub)
    changes.register(sub)
    snapshots.register(sub)
    policy.register(sub)
    tools.register(sub)
    mcp.register(sub)
    compare.register(sub)
    image.register(sub)
    shells.register(sub)
    return parser


def _usage_error(raw: list[str], error: InvalidArgument) -> int:
    """Bad usage: one line, the JSON ``policy test --json`` owes even then, and the command's status."""
    say(error.message)
    if raw[:2] == ["policy", "test"] and "--json" in raw[: raw.index("--") if "--" in raw else None]:
        from sandbox.cli import policy

        policy.print_refusal(None, error)
    return EXIT_SANDBOX if raw[:1] in (["run"], ["compare"]) else EXIT_ERROR


def main(argv: list[str] | None = None) -> int:
    raw = sys.argv[1:] if argv is None else argv
    parser = build_parser(only_run=raw[:1] == ["run"])
    try:
        try:
            args = parser.parse_args(raw)  # --help and --version print here
        except InvalidArgument as exc:
            return _usage_error(raw, exc)
        code: int = args.func(args)  # every handler is guarded: a refusal is already its status
    except BrokenPipeError:  # `sandbox … | head -1`: our reader went away, so we end quietly
        return reader_gone()
    return code


def entry() -> typing.NoReturn:
    """The console script: ``main``, then exit without the interpreter's teardown.

    Finalising a few hundred modules costs more than a short ``sandbox run`` itself; by the
    time ``main`` returns every jail is closed, every file we wrote is closed or committed, and
    only our own output buffers remain to flush. ``serve`` exits the ordinary way.
    """
    code = main()
    if sys.argv[1:2] in (["serve"], ["mcp"]):
        sys.exit(code)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)
