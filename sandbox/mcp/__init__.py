"""``sandbox mcp``: the sandbox's tools over the Model Context Protocol, on the official SDK.

Any MCP client (Claude Code, Codex CLI, Gemini CLI, the SDK's own ``ClientSession``) lists Bash,
Read, Write, Edit, Glob, Grep and LS and calls them through the same five boundaries as
``sandbox serve``: capability, parameters, policy, approval, execution in the jail, audited.

- :mod:`~sandbox.mcp.tools`: the MCP tool definitions (input schemas from the pydantic parameter
  models) and a :class:`~sandbox.tools.run.ToolResult` as a ``CallToolResult``: text for the
  model, ``structuredContent`` with both streams apart, byte counts, truncation, the error code.
- :mod:`~sandbox.mcp.approvals`: a ``confirm`` asked through MCP elicitation, failing closed.
- :mod:`~sandbox.mcp.server`: the low-level server: one sandbox session per MCP connection,
  Bash output as progress notifications, ``notifications/cancelled`` as the call's abort.
- :mod:`~sandbox.mcp.review`: review snapshots and rollback, a copy session's changes, and its
  kept changesets (applied or discarded only with the user's answer).
- :mod:`~sandbox.mcp.branches`: session snapshots (``Snapshot``, ``Restore``, a confirm in ``ask``)
  and ``Fork``, whose other branches are servers started ``--from-snapshot``.
- :mod:`~sandbox.mcp.transport`: stdio, and streamable HTTP on a loopback port or a unix socket
  behind a bearer token.

The server speaks the handshake era of the protocol (2025-11-25 and earlier), where a server may
ask its client mid-call; a client that probes the 2026-07-28 per-request era is answered "method
not found" and falls back to the handshake, as the SDK's ``mode="auto"`` does.
"""

from __future__ import annotations

from sandbox.mcp.server import McpOptions, build_server

__all__ = ["McpOptions", "build_server"]
