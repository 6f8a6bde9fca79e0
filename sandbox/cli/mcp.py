"""``sandbox mcp``: the tools as an MCP server (stdio, or streamable HTTP with a bearer token).

The workspace, profile, backend and ``--from-snapshot``'s snapshot are checked before serving: a
bad one is one line on stderr and exit status 2, never a client that connects to a server that
cannot run anything. The session itself (the jail) opens at a connection's first tool call. See
:mod:`sandbox.mcp`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from sandbox.cli import options
from sandbox.cli.output import EXIT_ERROR, guard

if TYPE_CHECKING:
    import argparse

    from sandbox.cli.options import Subparsers


def register(sub: Subparsers) -> None:
    mcp = sub.add_parser(
        "mcp",
        help="MCP server for any MCP client (Claude Code, Codex CLI, Gemini CLI ...): stdio, or --http/--unix",
    )
    options.add_workspace(mcp)
    options.add_profile(mcp, default="default")
    options.add_backend(mcp)
    options.add_mode(mcp)
    options.add_mount(mcp)
    mcp.add_argument(
        "--from-snapshot",
        metavar="ID",
        help="open each connection's session from this session snapshot of the workspace (a Fork's branch point)",
    )
    where = mcp.add_mutually_exclusive_group()
    where.add_argument(
        "--http", metavar="HOST:PORT", help="streamable HTTP on this address (loopback unless --allow-remote)"
    )
    where.add_argument("--unix", metavar="PATH", type=Path, help="streamable HTTP on a unix socket (mode 0600)")
    mcp.add_argument("--allow-remote", action="store_true", help="let --http bind a non-loopback address")
    mcp.add_argument(
        "--token-file",
        type=Path,
        help="HTTP: the bearer token clients must send (else $SANDBOX_MCP_TOKEN, else one generated and printed)",
    )
    mcp.set_defaults(func=guard(cmd_mcp, EXIT_ERROR))


def cmd_mcp(args: argparse.Namespace) -> int:
    import anyio

    from sandbox import profile as profiles
    from sandbox import snapshots
    from sandbox.calls import check_workspace
    from sandbox.mcp import McpOptions, transport

    options.check_backend(args.backend)
    workspace = check_workspace(args.workspace or Path.cwd())
    # A bad profile, backend or mount is refused now, not at the first call.
    profiles.load(args.profile).with_overrides(**{"backend": args.backend, "mount.strategy": args.mount})
    if args.from_snapshot is not None:  # one of this workspace's (a session opening from it checks the host)
        snapshots.read(args.from_snapshot).check_workspace(workspace)
    opts = McpOptions(str(workspace), args.profile, args.backend, args.mode, args.mount, args.from_snapshot)
    if args.http is None and args.unix is None:
        anyio.run(transport.serve_stdio, opts)
        return 0
    token, generated = transport.resolve_token(args.token_file)
    if args.unix is not None:
        sock, host = transport.bind_unix(args.unix), None
    else:
        host, port = transport.parse_address(args.http)
        sock = transport.bind_tcp(host, port, allow_remote=args.allow_remote)

    def announce(url: str) -> None:
        shown = (
            f"; bearer token {token}"
            if generated
            else f" (bearer token from {args.token_file or '$' + transport.TOKEN_ENV})"
        )
        transport.say(f"streamable HTTP on {url}{shown}")

    try:
        anyio.run(lambda: transport.serve_http(opts, sock, token, host=host, announce=announce))
    finally:
        sock.close()
        if args.unix is not None:
            args.unix.unlink(missing_ok=True)
    return 0
