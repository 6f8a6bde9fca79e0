"""``sandbox policy network``: the user's own network list, which every allowlist session follows live.

``sandbox policy network`` shows it; ``allow PATTERN`` and ``deny PATTERN`` add to it, ``remove
PATTERN`` takes a pattern off; a running session follows from its next command
(:mod:`sandbox.network.userlist`). Patterns are the allowlist's: ``host``, ``*.host``,
``host:port``, an IP or a CIDR.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from sandbox.cli import options

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable

    Handler = Callable[[argparse.Namespace], int]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser], guard: Callable[[Handler], Handler]) -> None:
    network = sub.add_parser(
        "network",
        help="show or change your own network list (allow, deny, remove PATTERN): every allowlist session "
        "follows it, a running one from its next command",
    )
    network.add_argument("action", nargs="?", choices=("allow", "deny", "remove"), help="what to do (default: show)")
    network.add_argument("pattern", nargs="?", help="host, *.host, host:port, an IP or a CIDR")
    options.add_json(network)
    network.set_defaults(func=guard(_network))


def _network(args: argparse.Namespace) -> int:
    from sandbox.errors import InvalidArgument
    from sandbox.network.userlist import UserNetwork

    store = UserNetwork()
    if args.action is not None:
        if not args.pattern:
            raise InvalidArgument(f"sandbox policy network {args.action} needs a PATTERN")
        if args.action == "remove":
            if not store.remove(args.pattern):
                raise InvalidArgument(f"{args.pattern!r} is on neither list of {store.path}", pattern=args.pattern)
        else:
            store.add(args.action, args.pattern)
    lists = store.load()
    if args.json:
        print(json.dumps({"file": str(store.path), **{k: list(v) for k, v in lists.items()}}, indent=2))
        return 0
    print(f"your network list ({store.path}); every allowlist session follows it:")
    for kind in ("allow", "deny"):
        print(f"  {kind:5}  {', '.join(lists[kind]) if lists[kind] else '(none)'}")
    return 0
