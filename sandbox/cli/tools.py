"""``sandbox tool`` (one call through all five boundaries) and ``sandbox serve`` (JSON-RPC).

``tool`` exits 0 when the call succeeded, 1 when the tool reported a failure (its error code on
stderr), 2 when ``--args`` is not a JSON object, and 125 when the sandbox refused or broke (one
line on stderr and, with ``--json``, a failed ToolResult on stdout).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sandbox.cli import options
from sandbox.cli.output import EXIT_ERROR, guard, say
from sandbox.vocabulary import EXIT_SANDBOX

if TYPE_CHECKING:
    import argparse

    from sandbox.cli.options import Subparsers
    from sandbox.errors import SandboxError
    from sandbox.policy.approvals import Approver
    from sandbox.tools.run import ToolResult


def register(sub: Subparsers) -> None:
    tool = sub.add_parser(
        "tool",
        help="run one tool call (Bash, Read, Write, Edit, Glob, Grep, LS) through the "
        "capability, parameter, policy and approval boundaries into a jail",
    )
    tool.add_argument("name")
    tool.add_argument("--args", default="{}", help="the tool's arguments as a JSON object")
    options.add_workspace(tool)
    options.add_profile(tool, default="default")
    options.add_backend(tool)
    options.add_mode(tool)
    options.add_operating_mode(tool, help="the operating mode: plan and goal allow no Write, Edit nor plugin tool")
    options.add_json(tool, help="print the ToolResult as JSON")
    tool.set_defaults(func=guard(cmd_tool, EXIT_SANDBOX, answer=_json_failure))
    serve = sub.add_parser("serve", help="JSON-RPC 2.0 server over stdio for agents (see integrations/pi)")
    serve.add_argument("--schema", action="store_true", help="print the protocol's JSON Schemas and exit")
    serve.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="MANIFEST",
        help="declare a plugin (its JSON manifest) in every session; its tools need plugin.register's grant",
    )
    serve.add_argument(
        "--grant-plugin",
        action="append",
        default=[],
        metavar="ID",
        help="grant a declared plugin up front: its tools are registered in every session without asking",
    )
    serve.set_defaults(func=guard(cmd_serve, EXIT_ERROR))


def _json_failure(args: argparse.Namespace, error: SandboxError) -> None:
    if args.json:
        print(json.dumps({"ok": False, "error_code": error.code, "content": error.message, "details": error.data}))


def _approver() -> Approver:
    from sandbox.policy.approvals import TerminalApprover, UnattendedApprover

    if sys.stdin.isatty() and sys.stderr.isatty():
        return TerminalApprover(stdout=sys.stderr)
    return UnattendedApprover(allow=False)


def _arguments(text: str) -> dict[str, Any] | None:
    """``--args`` as a JSON object, or ``None`` once the problem is said."""
    try:
        parsed = json.loads(text)
    except ValueError as exc:
        say(f"INVALID_ARGUMENT: --args is not JSON: {exc}")
        return None
    if not isinstance(parsed, dict):
        say("INVALID_ARGUMENT: --args must be a JSON object")
        return None
    return parsed


def cmd_tool(args: argparse.Namespace) -> int:
    import anyio

    parsed = _arguments(args.args)
    if parsed is None:
        return EXIT_ERROR
    result = anyio.run(_tool, args, parsed)
    if args.json:
        print(result.model_dump_json())
    elif args.name != "Bash" or not result.ok:
        print(result.content)
    if not result.ok:
        say(str(result.error_code))
    return 0 if result.ok else 1


async def _tool(args: argparse.Namespace, parsed: dict[str, Any]) -> ToolResult:
    from sandbox.session import Sandbox

    options.check_backend(args.backend)
    stream = not args.json and args.name == "Bash"
    out = _echo(sys.stdout.buffer) if stream else None
    err = _echo(sys.stderr.buffer) if stream else None
    async with Sandbox.open(
        args.workspace or Path.cwd(),
        profile=args.profile,
        backend=args.backend,
        mode=args.mode,
        operating_mode=args.operating_mode,
        approver=_approver(),
    ) as session:
        for notice in session.notices:  # e.g. the project's policy file was ignored: not trusted
            say(notice["message"])
        return await session.call(args.name, parsed, on_stdout=out, on_stderr=err)


def _echo(fh: Any) -> Any:
    def write(chunk: bytes) -> None:
        fh.write(chunk)
        fh.flush()

    return write


def cmd_serve(args: argparse.Namespace) -> int:
    from sandbox import protocol

    declared = _plugins(args.plugin, args.grant_plugin) if args.plugin or args.grant_plugin else []
    if args.schema:
        from sandbox import server

        granted = [plugin for plugin in declared if plugin.id in args.grant_plugin]
        print(json.dumps(server.schema(granted), indent=2, sort_keys=True))
        return 0
    print("sandbox serve: JSON-RPC 2.0 on stdin/stdout", file=sys.stderr)
    if declared:  # initialize lists the granted plugins' tools: the full server answers it
        from sandbox import server

        return server.main(b"", declared, list(args.grant_plugin))
    # Answer the agent's first request before the heavy imports (see sandbox.protocol).
    line, rest = protocol.read_first_line(0)
    reply = protocol.early_reply(line)
    if reply is not None and not protocol.write_all(1, reply):
        return 0
    pending = rest if reply is not None else line + rest
    from sandbox import server

    return server.main(pending)


def _plugins(paths: list[str], granted: list[str]) -> list[Any]:
    """``--plugin`` manifests, loaded now (a bad one is refused before serving); each ``--grant-plugin``
    must name one of them."""
    from sandbox.errors import InvalidArgument
    from sandbox.plugins import load_all

    declared = load_all(paths)
    ids = {plugin.id for plugin in declared}
    for plugin_id in granted:
        if plugin_id not in ids:
            raise InvalidArgument(f"--grant-plugin {plugin_id}: no --plugin declares it (declared: {sorted(ids)})")
    return declared
