"""The MCP server: one sandbox session per connection, the tools, live output, cancellation.

A connection's session opens at its first tool call (so listing tools never starts a jail) and
closes with the connection: the SDK unwinds the connection's exit stack when stdin closes, an
HTTP session is deleted or goes idle. A call runs shielded from the SDK's cancellation: a
``notifications/cancelled`` (or the connection's end) sets the call's abort event instead, so the
executor kills the process tree and the session audits an ``ABORTED`` call before the handler
gives up the request, which the protocol then leaves unanswered.

A request's ``_meta`` may carry ``sandbox/turnId`` (the turn a refusal holds for) and
``sandbox/userMessage``, the user's latest message, which the classifier reads (seed 004: a
blocked call runs when the user's next message authorises it).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from sandbox import __version__
from sandbox import profile as profiles
from sandbox.errors import SandboxError
from sandbox.live import LiveOutput
from sandbox.mcp import branches, review, tools
from sandbox.mcp.approvals import ElicitationApprover, PendingCall
from sandbox.session import Sandbox, SessionOptions
from sandbox.threads import off_loop
from sandbox.tools.run import ToolResult

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from anyio.abc import TaskGroup
    from mcp.server.connection import Connection
    from mcp.server.context import CallNext, HandlerResult, ServerRequestContext

    from sandbox.vocabulary import BackendChoice, MountStrategy, Notice, PermissionMode, Stream

    Ctx = ServerRequestContext[Any, Any]

INSTRUCTIONS = (
    "Tools that run inside an OS-level sandbox: Bash, Read, Write, Edit, Glob, Grep and LS act on the "
    "workspace through a jail (bubblewrap or Docker) with a permission policy; a call the policy asks "
    "about is put to the user and denied when no one answers. Results carry error codes "
    "(structuredContent.error_code) that say what to do next: TOOL_DENIED (do not retry the same call), "
    "INVALID_ARGUMENT (fix the arguments), TIMEOUT, ABORTED, TOOL_FAILED."
)
_METHOD_NOT_FOUND = -32601
# The user's latest message, handed to the classifier (seed 004: "say it in your next message").
# In the request's _meta, which the client program sets, never in the arguments, which the model
# writes: an authorisation the model could type for itself would authorise nothing.
USER_MESSAGE_META = "sandbox/userMessage"
_NOTICES = "sandbox.notices"  # the opening notices, until the first result carries them


@dataclasses.dataclass(frozen=True)
class McpOptions:
    """How each connection's session is opened: ``sandbox mcp``'s options."""

    workspace: str
    profile: str = "default"
    backend: BackendChoice | None = None
    mode: PermissionMode | None = None
    mount: MountStrategy | None = None
    from_snapshot: str | None = None  # each connection's session opens from this session snapshot

    def session(self, approver: ElicitationApprover) -> SessionOptions:
        return SessionOptions(
            profile=self.profile,
            backend=self.backend,
            mode=self.mode,
            mount=self.mount,
            approver=approver,
            from_snapshot=self.from_snapshot,
        )

    def command(self) -> tuple[str, ...]:
        """This server's command line (a fork's branches are it, from their snapshot): a profile file
        by its absolute path, so the command runs from any directory."""
        named = self.profile in profiles.available()
        argv = ["sandbox", "mcp", "--workspace", self.workspace]
        argv += ["--profile", self.profile if named else str(Path(self.profile).resolve())]
        for flag, value in (("--backend", self.backend), ("--mode", self.mode), ("--mount", self.mount)):
            argv += [flag, value] if value else []
        return tuple(argv)


class Connections:
    """The sandbox session of each MCP connection, opened at first use, closed with the connection.

    The SDK gives a connection's exit stack a few seconds and then abandons it; a session's close
    (killing what runs, keeping a copy session's changes) must not be cut short, so the exit stack
    only hands the close to :attr:`closing`, a task group the transport waits for before it exits.
    """

    def __init__(self, options: McpOptions) -> None:
        self.options = options
        self._ids = itertools.count(1)
        self.closing: TaskGroup | None = None

    async def session(self, ctx: Ctx) -> tuple[Sandbox, ElicitationApprover]:
        connection = _connection(ctx)
        lock: anyio.Lock = connection.state.setdefault("sandbox.lock", anyio.Lock())
        async with lock:  # two first calls at once open one session
            opened: tuple[Sandbox, ElicitationApprover] | None = connection.state.get("sandbox")
            if opened is None:
                approver = ElicitationApprover()
                sandbox = await Sandbox.create(self.options.workspace, **self.options.session(approver))
                connection.exit_stack.push_async_callback(self._close, sandbox)
                opened = connection.state["sandbox"] = (sandbox, approver)
                connection.state[_NOTICES] = await off_loop(review.opening_notices, sandbox)
        return opened

    async def announce(self, ctx: Ctx, result: types.CallToolResult) -> types.CallToolResult:
        """The first result after the session opened, with its opening notices (each also a log
        message: a client may show those to the user); every later result as it is."""
        notices: list[Notice] = _connection(ctx).state.pop(_NOTICES, None) or []
        for notice in notices:
            await _log(ctx, notice)
        return tools.with_notices(result, notices) if notices else result

    async def _close(self, sandbox: Sandbox) -> None:
        if self.closing is None:
            await _shielded_close(sandbox)
        else:
            self.closing.start_soon(_shielded_close, sandbox)

    def call_id(self, ctx: Ctx) -> str:
        return f"mcp-{ctx.request_id}-{next(self._ids)}"


async def _shielded_close(sandbox: Sandbox) -> None:
    with anyio.CancelScope(shield=True):
        await sandbox.aclose()
    if sandbox.changeset_id is not None:  # the client is gone: the user reads it on our stderr
        sys.stderr.write(
            f"sandbox mcp: this session's changes are kept as {sandbox.changeset_id} "
            f"(sandbox changes show {sandbox.changeset_id}; sandbox changes apply {sandbox.changeset_id})\n"
        )
        sys.stderr.flush()


async def _log(ctx: Ctx, notice: Notice) -> None:
    """A notice as a ``notifications/message`` on the call's stream. The 2026-07-28 protocol drops
    logging, which this server does not speak (:func:`_handshake_era_only`); the SDK warns of it."""
    level: types.LoggingLevel = "warning" if notice["code"] == "changes.recovered" else "notice"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MCPDeprecationWarning)
        await ctx.session.send_log_message(level, notice, logger="sandbox", related_request_id=ctx.request_id)


def _connection(ctx: Ctx) -> Connection:
    # The SDK keeps the per-connection state (and the exit stack it unwinds when the connection
    # ends) on the Connection, which a low-level handler reaches only through its session.
    connection: Connection = ctx.session._connection
    return connection


def build_server(options: McpOptions, connections: Connections | None = None) -> Server[Any]:
    """The low-level server with the sandbox's tools, review tools and snapshot resources."""
    connections = connections or Connections(options)

    async def list_tools(_ctx: Ctx, _params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[*tools.definitions(), *review.definitions(), *branches.definitions()])

    async def call_tool(ctx: Ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
        name, args = params.name, dict(params.arguments or {})
        try:
            sandbox, approver = await connections.session(ctx)
        except SandboxError as exc:
            return tools.error_result(name, exc.code, f"the sandbox session could not open: {exc.message}", **exc.data)
        if name in review.HANDLERS:
            return await connections.announce(ctx, await review.call(sandbox, approver, ctx, name, args))
        if name in branches.HANDLERS:
            call_id, turn = connections.call_id(ctx), _turn(ctx)
            branch = branches.BranchCall(sandbox, approver, ctx, name, args, call_id, turn, options.command())
            return await connections.announce(ctx, await _run_branch(branch))
        message = (ctx.meta or {}).get(USER_MESSAGE_META)
        if message is not None and not isinstance(message, str):
            what = f"_meta[{USER_MESSAGE_META!r}] must be the user's latest message as a string"
            return tools.error_result(name, "INVALID_ARGUMENT", what, meta=USER_MESSAGE_META)
        result = await _run_tool(sandbox, approver, ctx, connections.call_id(ctx), name, args, message or None)
        return await connections.announce(ctx, result)

    async def list_resources(_ctx: Ctx, _params: types.PaginatedRequestParams | None) -> types.ListResourcesResult:
        return types.ListResourcesResult(resources=review.resources())

    async def read_resource(ctx: Ctx, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
        opened = _connection(ctx).state.get("sandbox")
        return await review.read_resource(opened[0] if opened else None, Path(options.workspace), str(params.uri))

    async def set_logging_level(_ctx: Ctx, _params: types.SetLevelRequestParams) -> types.EmptyResult:
        return types.EmptyResult()  # a few notices a session: every one is sent whatever the level

    with warnings.catch_warnings():  # the logging capability, deprecated by the 2026-07-28 protocol only
        warnings.simplefilter("ignore", MCPDeprecationWarning)
        server: Server[Any] = Server(
            "sandbox",
            version=__version__,
            instructions=INSTRUCTIONS,
            on_list_tools=list_tools,
            on_call_tool=call_tool,
            on_list_resources=list_resources,
            on_read_resource=read_resource,
            on_set_logging_level=set_logging_level,
        )
    server.middleware.append(_handshake_era_only)
    return server


async def _handshake_era_only(ctx: Ctx, call_next: CallNext) -> HandlerResult:
    """Refuse the 2026-07-28 per-request era: it forbids asking the client mid-call, which the
    approvals need; ``server/discover`` answered "method not found" sends a client to the handshake."""
    if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS and ctx.request_id is not None:
        raise MCPError(
            code=_METHOD_NOT_FOUND,
            message="this server speaks the initialize handshake (protocol 2025-11-25 and earlier)",
        )
    return await call_next(ctx)


async def _run_tool(
    sandbox: Sandbox,
    approver: ElicitationApprover,
    ctx: Ctx,
    call_id: str,
    name: str,
    args: dict[str, Any],
    user_message: str | None = None,
) -> types.CallToolResult:
    abort = anyio.Event()
    approver.calls[call_id] = PendingCall(ctx, abort)
    limits = sandbox.profile.limits
    progress = _Progress(ctx)
    live = LiveOutput(
        progress.send, progress.withheld, per_stream=limits.live_stream_bytes, total=limits.live_total_bytes
    )

    async def run() -> ToolResult:
        async with anyio.create_task_group() as streaming:
            streaming.start_soon(live.run)
            result = await sandbox.call(
                name,
                args,
                tool_call_id=call_id,
                turn_id=_turn(ctx),
                abort=abort,
                on_stdout=live.callback("stdout"),
                on_stderr=live.callback("stderr"),
                user_message=user_message,
            )
            await live.finish()
        return result

    try:
        result = await _abortable(run, abort)
    finally:
        approver.calls.pop(call_id, None)
    if name == "Bash":
        result.details["live"] = live.summary()
    return tools.call_result(name, call_id, result)


async def _run_branch(branch: branches.BranchCall) -> types.CallToolResult:
    """A Snapshot, Restore or Fork, shielded as a tool call is: a cancellation withdraws a restore's
    pending question (the restore is denied) and waits for the operation to end, never cutting a
    jail's swap short."""
    abort = anyio.Event()
    branch.approver.calls[branch.call_id] = PendingCall(branch.ctx, abort)
    try:
        result = await _abortable(lambda: branches.call(branch), abort)
    finally:
        branch.approver.calls.pop(branch.call_id, None)
    return tools.call_result(branch.name, branch.call_id, result)


async def _abortable(run: Callable[[], Awaitable[ToolResult]], abort: anyio.Event) -> ToolResult:
    """``run()`` shielded; a cancellation of ours sets ``abort``, waits for the call to end, re-raises.

    The executor kills the tree on abort and the session audits the call: a cancelled scope would
    kill the tree too, but leave the call unaudited."""
    box: list[ToolResult] = []
    done = anyio.Event()

    async def shielded() -> None:
        with anyio.CancelScope(shield=True):
            try:
                box.append(await run())
            except Exception as exc:  # a bug of ours is the call's failure, never a protocol crash
                content = f"the sandbox failed: {type(exc).__name__}: {exc}"
                box.append(ToolResult(ok=False, error_code="TOOL_FAILED", content=content))
            finally:
                done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(shielded)
        try:
            await done.wait()
        except anyio.get_cancelled_exc_class():
            abort.set()
            with anyio.CancelScope(shield=True):
                await done.wait()
            raise
    return box[0]


def _turn(ctx: Ctx) -> str:
    """The client's turn id where its request's ``_meta`` names one (``sandbox/turnId``); else, when
    it carries the user's message, a turn of that message (a new message is a new turn, so a call
    refused in the last one is judged again with the authorisation the user just gave); else one turn."""
    meta = ctx.meta or {}
    turn = meta.get("sandbox/turnId")
    if isinstance(turn, str) and turn:
        return turn
    message = meta.get(USER_MESSAGE_META)
    if isinstance(message, str) and message:
        return "message-" + hashlib.sha256(message.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return "turn-0"


class _Progress:
    """Live output as ``notifications/progress`` (a no-op when the request gave no progress token):
    ``progress`` counts the bytes sent so far (it must grow), the message is the chunk, its stream named."""

    def __init__(self, ctx: Ctx) -> None:
        self.ctx = ctx
        self.sent = 0

    async def send(self, stream: Stream, chunk: bytes) -> None:
        self.sent += len(chunk)
        text = chunk.decode("utf-8", errors="replace")
        await self.ctx.session.report_progress(float(self.sent), None, f"[{stream}] {text}")

    async def withheld(self, counts: dict[Stream, int]) -> None:
        what = ", ".join(f"{stream} {count} bytes" for stream, count in counts.items() if count)
        self.sent += 1
        note = f"[live output budget reached: {what} not streamed; the result keeps head and tail]"
        await self.ctx.session.report_progress(float(self.sent), None, note)
