"""What the ``sandbox`` command says, and the one place a refusal becomes an exit status.

Diagnostics are single lines on stderr (:func:`say`); a ``--json`` answer is one object on
stdout (:func:`emit`). :func:`guard` is the command's error boundary: a
:class:`~sandbox.errors.SandboxError` raised by a handler (alone, or inside the exception group
of a task group) becomes one ``sandbox: …`` line, whatever JSON the command owes its reader, and
the command's own exit status. Any other exception is a bug and passes, with its traceback.

Standard library only: the quick path of ``sandbox run`` imports this module.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from typing import TYPE_CHECKING, Any

from sandbox.errors import SandboxError, find_error

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable

    Handler = Callable[[argparse.Namespace], int]

EXIT_ERROR = 2
"""What every command but ``run``, ``compare`` and ``tool`` exits with when it refuses (as
argparse does on bad usage)."""


def say(line: str, *, who: str = "sandbox") -> None:
    """One line on stderr, ``who: line``."""
    with contextlib.suppress(OSError):  # nobody reads our stderr any more: nothing to tell
        print(f"{who}: {line}", file=sys.stderr, flush=True)


def message(error: SandboxError) -> str:
    """An error's message without its code, for the commands that print it so."""
    return error.message


def guard(
    handler: Handler,
    status: int,
    *,
    render: Callable[[SandboxError], str] = str,
    who: str = "sandbox",
    answer: Callable[[argparse.Namespace, SandboxError], object] | None = None,
) -> Handler:
    """``handler``, with a :class:`SandboxError` turned into ``render(error)`` on stderr, then
    ``answer(args, error)`` (the JSON a ``--json`` reader is owed), then exit ``status``."""

    def guarded(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except (SandboxError, BaseExceptionGroup) as exc:
            error = find_error(exc, SandboxError)
            if error is None:
                raise
            say(render(error), who=who)
            if answer is not None:
                answer(args, error)
            return status

    return guarded


EXIT_SIGPIPE = 141
"""A command whose reader went away (``sandbox … | head -1``) ends quietly with this, as SIGPIPE
ends a Unix tool (128 + 13)."""


def reader_gone() -> int:
    """Our stdout's reader has gone: stdout becomes /dev/null (else the interpreter's last flush of
    the same buffer prints a traceback-like warning), and the status is :data:`EXIT_SIGPIPE`."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    return EXIT_SIGPIPE


def emit(obj: dict[str, Any]) -> bool:
    """Write one JSON line on stdout; ``False`` when nobody reads it any more."""
    try:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        reader_gone()
        return False
    return True


def json_command(parser: argparse.ArgumentParser, handler: Handler) -> None:
    """A subcommand that answers one JSON object with ``--json``: a refusal too (``{"error": …}``), with
    the refusal's exit status (:data:`EXIT_ERROR`)."""
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    parser.set_defaults(func=guard(handler, EXIT_ERROR, answer=json_refusal))


def json_refusal(args: argparse.Namespace, error: SandboxError) -> None:
    """A refusal as ``{"error": …}`` on stdout, when ``--json`` asked for one object."""
    if args.json:
        emit({"error": error.to_dict()})
