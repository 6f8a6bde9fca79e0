"""``sandbox tool`` (one call through all five boundaries) and ``sandbox serve`` (JSON-RPC)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sandbox.errors import InvalidArgument, SandboxError

if TYPE_CHECKING:
    import argparse

    from sandbox.cli import Subparsers
    from sandbox.policy.approvals import Approver
    from sandbox.tools.run import ToolResult

EXIT_SANDBOX = 125


def register(sub: Subparsers) -> None:
    tool = sub.add_parser(
        "tool",
        help="run one tool call (Bash, Read, Write, Edit, Glob, Grep, LS) through the "
        "capability, parameter, policy and approval boundaries into a jail",
    )
    tool.add_argument("name")
    tool.add_argument("--args", default="{}", help="the tool's arguments as a JSON object")
    tool.add_argument("--workspace", type=Path, default=None, help="default: the current directory")
    tool.add_argument("--profile", default="default")
    tool.add_argument("--backend", default=None)
    tool.add_argument("--mode", choices=("ask", "accept-edits", "auto"), default=None)
    tool.add_argument("--plan", action="store_true", help="plan operating mode: no Write/Edit")
    tool.add_argument("--json", action="store_true", help="print the ToolResult as JSON")
    tool.set_defaults(func=cmd_tool)
    serve = sub.add_parser("serve", help="JSON-RPC 2.0 server over stdio for agents (see integrations/pi)")
    serve.add_argument("--schema", action="store_true", help="print the protocol's JSON Schemas and exit")
    serve.set_defaults(func=cmd_serve)


def _approver() -> Approver:
    from sandbox.policy.approvals import TerminalApprover, UnattendedApprover

    if sys.stdin.isatty() and sys.stderr.isatty():
        return TerminalApprover(stdout=sys.stderr)
    return UnattendedApprover(allow=False)


def cmd_tool(args: argparse.Namespace) -> int:
    import anyio

    try:
        parsed = json.loads(args.args)
    except ValueError as exc:
        print(f"sandbox: INVALID_ARGUMENT: --args is not JSON: {exc}", file=sys.stderr)
        return 2
    if not isinstance(parsed, dict):
        print("sandbox: INVALID_ARGUMENT: --args must be a JSON object", file=sys.stderr)
        return 2
    try:
        result = anyio.run(_tool, args, parsed)
    except SandboxError as exc:
        print(f"sandbox: {exc}", file=sys.stderr)
        if args.json:
            print(json.dumps({"ok": False, "error_code": exc.code, "content": exc.message, "details": exc.data}))
        return EXIT_SANDBOX
    if args.json:
        print(result.model_dump_json())
    elif args.name != "Bash" or not result.ok:
        print(result.content)
    if not result.ok:
        print(f"sandbox: {result.error_code}", file=sys.stderr)
    return 0 if result.ok else 1


async def _tool(args: argparse.Namespace, parsed: dict[str, Any]) -> ToolResult:
    from sandbox.session import Sandbox

    stream = not args.json and args.name == "Bash"
    out = _echo(sys.stdout.buffer) if stream else None
    err = _echo(sys.stderr.buffer) if stream else None
    async with Sandbox.open(
        args.workspace or Path.cwd(),
        profile=args.profile,
        backend=args.backend,
        mode=args.mode,
        operating_mode="plan" if args.plan else None,
        approver=_approver(),
    ) as session:
        return await session.call(args.name, parsed, on_stdout=out, on_stderr=err)


def _echo(fh: Any) -> Any:
    def write(chunk: bytes) -> None:
        fh.write(chunk)
        fh.flush()

    return write


def cmd_serve(args: argparse.Namespace) -> int:
    from sandbox import protocol

    if args.schema:
        from sandbox import server

        print(json.dumps(server.schema(), indent=2, sort_keys=True))
        return 0
    print("sandbox serve: JSON-RPC 2.0 on stdin/stdout", file=sys.stderr)
    # Answer the agent's first request before the heavy imports (see sandbox.protocol).
    line, rest = protocol.read_first_line(0)
    reply = protocol.early_reply(line)
    if reply is not None and not protocol.write_all(1, reply):
        return 0
    pending = rest if reply is not None else line + rest
    from sandbox import server

    try:
        return server.main(pending)
    except InvalidArgument as exc:
        print(f"sandbox: {exc}", file=sys.stderr)
        return 2
