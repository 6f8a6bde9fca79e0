"""``sandbox shells``: the shell catalogue (the shells the Bash tool may run in, by stable id),
which one each backend would use, and ``sandbox shells default ID`` to store the user's default.

A stored id that is unknown, or not a shell of this platform, is COMMAND_SHELL_INVALID (exit 2).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from sandbox.cli import options
from sandbox.cli.output import EXIT_ERROR, guard

if TYPE_CHECKING:
    import argparse

    from sandbox.cli.options import Subparsers


def register(sub: Subparsers) -> None:
    shells = sub.add_parser("shells", help="the shell catalogue, the effective shell per platform, the stored default")
    options.add_json(shells)
    commands = shells.add_subparsers(dest="shells_command")
    default = commands.add_parser("default", help="store the default shell (an id of the catalogue)")
    default.add_argument("id")
    default.set_defaults(func=guard(_set_default, EXIT_ERROR))
    shells.set_defaults(func=guard(_list, EXIT_ERROR))


def _list(args: argparse.Namespace) -> int:
    from sandbox import shells

    stored = shells.ShellStore().default()
    effective = {
        platform: shells.effective(backend).id for platform, backend in (("posix", "bwrap"), ("windows", "winjob"))
    }
    listed = [
        {
            "id": shell.id,
            "dialect": shell.dialect,
            "platform": shell.platform,
            "effective": effective[shell.platform] == shell.id,
            "description": shell.description,
        }
        for shell in shells.CATALOGUE
    ]
    if args.json:
        print(json.dumps({"default": stored, "shells": listed}, indent=2))
        return 0
    print(f"stored default: {stored or '-'} (a profile's winjob.shell comes first)")
    for item in listed:
        mark = "*" if item["effective"] else " "
        print(f"{mark} {item['id']:19} {item['platform']:8} {item['dialect']:11} {item['description']}")
    return 0


def _set_default(args: argparse.Namespace) -> int:
    from sandbox import shells

    shell = shells.ShellStore().set_default(args.id)
    print(f"default shell: {shell.id} ({shell.dialect})")
    return 0
