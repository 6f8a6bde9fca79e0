"""``sandbox serve``: JSON-RPC 2.0 over stdio, one JSON object per line, for agents.

Requests run concurrently; output of a running tool arrives as ``tool.output`` notifications
tagged ``stdout``/``stderr``; approvals are server-to-client ``approval.request`` calls that fail
closed (no answer in time, an error answer or a closed pipe: deny). When stdin closes, every
session is closed and every process it started is killed. See integrations/pi/PROTOCOL.md.

A ``copy``/``overlay`` session's changes are kept (:mod:`sandbox.changes`) when it closes, and
``session.close`` names the changeset; ``changes.*`` review, apply and discard kept changesets.

Each method is registered once, with its params model, by the ``@method`` decorator on its
handler: :data:`METHODS` is what the server dispatches and what ``sandbox serve --schema`` lists.
Here are the methods and the sessions they act on; the params models are in
:mod:`sandbox.server_messages`, the line transport and the error codes in :mod:`sandbox.jsonrpc`,
the approval and classifier requests to the client in :mod:`sandbox.server_requests`.
"""

from __future__ import annotations

import contextlib
import sys
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, NamedTuple, TypeVar

import anyio
import anyio.lowlevel
from pydantic import BaseModel

from sandbox import changes, server_requests, snapshots
from sandbox import plugins as plugin_tools
from sandbox.audit import AuditLog
from sandbox.backends.child import FdReceiveStream
from sandbox.ending import end_on_signal
from sandbox.errors import InvalidArgument, SandboxError
from sandbox.jsonrpc import (
    INVALID_PARAMS,
    INVALID_REQUEST,
    MAX_LINE,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    SANDBOX_ERROR,
    Lines,
    RpcError,
    Writer,
    parse,
    unexpected,
    validate_params,
)
from sandbox.live import LiveOutput
from sandbox.policy.approvals import ApprovalUnavailable
from sandbox.protocol import PROTOCOL, initialize_result
from sandbox.server_messages import (
    AuditQueryParams,
    ChangesApplyParams,
    ChangesetParams,
    ChangesListParams,
    ChangesShowParams,
    InitializeParams,
    NoParams,
    PluginParams,
    RollbackParams,
    SessionConfigureParams,
    SessionForkParams,
    SessionOpenParams,
    SessionParams,
    SessionRestoreParams,
    ToolCallParams,
    ToolCancelParams,
    ToolCheckParams,
    ToolOutput,
)
from sandbox.server_requests import RpcApprover, RpcClassifier
from sandbox.session import Sandbox
from sandbox.threads import off_loop
from sandbox.tools.params import REGISTRY
from sandbox.tools.run import ToolResult

if TYPE_CHECKING:
    from anyio.abc import TaskGroup

    from sandbox.policy.classifier import Classifier
    from sandbox.vocabulary import Stream


P = TypeVar("P", bound=BaseModel)
Handler = Callable[["Server", P], Awaitable[dict[str, Any]]]


class Method(NamedTuple, Generic[P]):
    """A JSON-RPC method: the model its params must validate against, and its handler."""

    params: type[P]
    handler: Handler[P]


METHODS: dict[str, Method[Any]] = {}
"""Every method the server answers, in the order the schema lists them; filled by ``@method``."""


def method(name: str, params: type[P]) -> Callable[[Handler[P]], Handler[P]]:
    """Register the decorated ``Server`` coroutine as the handler of ``name``, taking ``params``."""

    def register(handler: Handler[P]) -> Handler[P]:
        METHODS[name] = Method(params, handler)
        return handler

    return register


def schema(plugins: list[plugin_tools.Plugin] | None = None) -> dict[str, Any]:
    """JSON Schemas of every message, generated from their models (and ``plugins``' tools)."""
    plugin_schemas = {name: plugin_tools.schema_of(t.spec) for p in plugins or [] for name, t in p.tools.items()}
    return {
        "protocol": PROTOCOL,
        "requests": {name: m.params.model_json_schema() for name, m in METHODS.items()},
        "results": {"tool.call": ToolResult.model_json_schema()},
        "notifications": {"tool.output": ToolOutput.model_json_schema()},
        "server_requests": server_requests.schemas(),
        "tools": {**{name: spec.params.model_json_schema() for name, spec in REGISTRY.items()}, **plugin_schemas},
    }


class Server:
    def __init__(
        self, writer: Writer, plugins: list[plugin_tools.Plugin] | None = None, granted: list[str] | None = None
    ) -> None:
        """``plugins`` are declared for every session (``serve --plugin``); ``granted``, the ids among
        them the user granted up front (``serve --grant-plugin``): registered in every session."""
        self.writer = writer
        self.plugins = plugins or []
        self.granted = granted or []
        self.sessions: dict[str, Sandbox] = {}
        self.aborts: dict[str, anyio.Event] = {}
        self.by_request: dict[Any, str] = {}
        self.pending: dict[str, Any] = {}
        self.stop = anyio.Event()
        self.tasks: TaskGroup | None = None  # serve()'s, for notifications no request awaits

    # -- plumbing ---------------------------------------------------------------------------------

    async def request(self, method: str, params: dict[str, Any]) -> Any:
        """A server-to-client request; raises ApprovalUnavailable when the client is gone or errs."""
        if self.writer.closed or self.stop.is_set():
            raise ApprovalUnavailable("the client is gone")
        rid = f"s-{uuid.uuid4().hex[:12]}"
        send, receive = anyio.create_memory_object_stream[Any](1)
        self.pending[rid] = send
        try:
            with receive:
                await self.writer.send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
                reply = await receive.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError) as exc:
            raise ApprovalUnavailable("the client closed the connection") from exc
        finally:
            self.pending.pop(rid, None)
            send.close()  # unanswered (cancelled, timed out): both ends closed, none left to the collector
        if "error" in reply:
            raise ApprovalUnavailable(f"the client answered with an error: {reply['error']}")
        return reply.get("result")

    def _resolve(self, message: dict[str, Any]) -> None:
        stream = self.pending.pop(str(message.get("id")), None)
        if stream is not None:
            with contextlib.suppress(anyio.WouldBlock, anyio.BrokenResourceError):
                stream.send_nowait(message)
            stream.close()

    def client_gone(self) -> None:
        for stream in list(self.pending.values()):
            stream.close()
        self.pending.clear()
        self.stop.set()

    async def dispatch(self, line: bytes | None) -> None:
        """One line from the client (``None``: one longer than :data:`MAX_LINE`, skipped); whatever
        goes wrong with it is answered, and ends neither the other requests nor the server."""
        try:
            await self._dispatch(line)
        except Exception as exc:  # the last net: a bug or a resource ends this line only
            await self._reply(None, error=unexpected(exc))

    async def _dispatch(self, line: bytes | None) -> None:
        if line is None:
            await self._reply(None, error=RpcError(PARSE_ERROR, f"parse error: a line longer than {MAX_LINE} bytes"))
            return
        try:
            message = parse(line)
        except (ValueError, MemoryError) as exc:
            await self._reply(None, error=RpcError(PARSE_ERROR, f"parse error: {exc or 'out of memory'}"))
            return
        if not isinstance(message, dict):
            await self._reply(None, error=RpcError(INVALID_REQUEST, "a message must be a JSON object"))
            return
        if "method" not in message:
            self._resolve(message)
            return
        rid = message.get("id")
        if not isinstance(rid, (str, int, float, type(None))) or not isinstance(message["method"], str):
            # JSON-RPC 2.0: an id is a string, a number or null; a method is a string.
            problem = "an id must be a string, a number or null, and a method a string"
            await self._reply(None, error=RpcError(INVALID_REQUEST, problem))
            return
        if message["method"] == "$/cancelRequest":
            params = message.get("params")
            target = params.get("id") if isinstance(params, dict) else None
            call = self.by_request.get(target) if isinstance(target, (str, int, float)) else None
            if call in self.aborts:
                self.aborts[call].set()
            return
        await self._handle(message)

    async def _handle(self, message: dict[str, Any]) -> None:
        rid, method = message.get("id"), message.get("method")
        try:
            registered = METHODS.get(str(method))
            if registered is None:
                raise RpcError(METHOD_NOT_FOUND, f"unknown method {method!r}; methods: {', '.join(METHODS)}")
            params = validate_params(str(method), registered.params, message.get("params") or {})
            if isinstance(params, ToolCallParams):
                params.tool_call_id = params.tool_call_id or f"call-{uuid.uuid4().hex[:12]}"
                self.by_request[rid] = params.tool_call_id
            result = await registered.handler(self, params)
        except RpcError as exc:
            await self._reply(rid, error=exc)
        except SandboxError as exc:
            await self._reply(rid, error=RpcError(SANDBOX_ERROR, exc.message, exc.to_dict()))
        except Exception as exc:  # EMFILE, ENOSPC, MemoryError or a bug: this request fails, not the server
            await self._reply(rid, error=unexpected(exc, str(method)))
        else:
            await self._reply(rid, result=result)
            if method == "shutdown":
                self.stop.set()
        finally:
            self.by_request.pop(rid, None)

    async def _reply(self, rid: Any, *, result: Any = None, error: RpcError | None = None) -> None:
        if rid is None and error is None:
            return  # a notification gets no answer
        body: dict[str, Any] = {"jsonrpc": "2.0", "id": rid}
        if error is not None:
            body["error"] = {
                "code": error.code,
                "message": error.message,
                **({"data": error.data} if error.data is not None else {}),
            }
        else:
            body["result"] = result
        await self.writer.send(body)

    def _session(self, session_id: str) -> Sandbox:
        try:
            return self.sessions[session_id]
        except KeyError:
            raise RpcError(
                INVALID_PARAMS,
                f"unknown session {session_id!r}",
                {"code": "INVALID_ARGUMENT", "session_id": session_id},
            ) from None

    # -- methods ----------------------------------------------------------------------------------

    @method("initialize", InitializeParams)
    async def initialize(self, _params: InitializeParams) -> dict[str, Any]:
        result = initialize_result()
        granted = [p for p in self.plugins if p.id in self.granted]
        result["tools"] = [*result["tools"], *(name for p in granted for name in p.tools)]
        if self.plugins:
            result["plugins"] = [p.describe(p.id in self.granted) for p in self.plugins]
        return result

    @method("session.open", SessionOpenParams)
    async def session_open(self, p: SessionOpenParams) -> dict[str, Any]:
        options = p.options(RpcApprover(self.request))
        options["plugins"] = [*(str(plugin.path) for plugin in self.plugins), *(p.plugins or [])]
        options["granted_plugins"] = list(self.granted)
        sandbox = await Sandbox.create(p.workspace, **options)
        try:
            sandbox.classifier = self._classifier(p, sandbox.classifier)
        except SandboxError:
            await sandbox.aclose()
            raise
        return self._opened(sandbox)

    def _opened(self, sandbox: Sandbox) -> dict[str, Any]:
        """A session opened (by session.open, or a fork): served from now on, and described."""
        self.sessions[sandbox.session_id] = sandbox
        if sandbox.jail.egress is not None:
            sandbox.on_denial = self._denied
        return {
            "session_id": sandbox.session_id,
            "workspace": str(sandbox.workspace),
            "scratch_dir": str(sandbox.scratch),
            "backend": sandbox.jail.backend,
            "mount": sandbox.jail.mount,
            "profile": sandbox.profile.name,
            "mode": sandbox.gate.mode_for(sandbox.state),
            "operating_mode": sandbox.gate.settings.operating_mode,
            "notices": sandbox.notices,
            "trust": sandbox.trust,  # the project's policy file: loaded or not, and who decided
            "plugins": sandbox.plugins_listing(),
            "snapshot_id": sandbox.current_snapshot,  # the snapshot it was opened from, if any
        }

    def _classifier(self, p: SessionOpenParams, builtin: Classifier | None) -> Classifier | None:
        """Who judges for a session; ``builtin`` is the profile's client, if it names an endpoint."""
        if p.classifier == "none":
            return None
        if p.classifier == "client":
            return RpcClassifier(self.request)
        if p.classifier == "builtin" and builtin is None:
            raise InvalidArgument("classifier 'builtin' needs the profile's policy.classifier_endpoint")
        return builtin or RpcClassifier(self.request)

    @method("session.close", SessionParams)
    async def session_close(self, p: SessionParams) -> dict[str, Any]:
        sandbox = self._session(p.session_id)
        del self.sessions[p.session_id]
        await sandbox.aclose()
        if sandbox.jail.tree is None:
            return {"closed": True}
        kept = sandbox.kept  # a copy/overlay session's changes, kept for review: never discarded
        return {
            "closed": True,
            "changeset_id": kept.id if kept is not None else None,
            "counts": kept.summary()["counts"] if kept is not None else None,
        }

    @method("session.configure", SessionConfigureParams)
    async def session_configure(self, p: SessionConfigureParams) -> dict[str, Any]:
        sandbox = self._session(p.session_id)
        sandbox.configure(mode=p.mode, operating_mode=p.operating_mode, network=p.network, secrets=p.secrets)
        network = sandbox.profile.network
        return {
            "network": {"mode": network.mode, "allow": list(network.allow), "deny": list(network.deny)},
            "session_id": p.session_id,
            "mode": sandbox.gate.mode_for(sandbox.state),
            "mode_source": sandbox.gate.mode_source(sandbox.state),  # session, profile, global or default
            "operating_mode": sandbox.gate.settings.operating_mode,
            "notices": sandbox.mode_notices(),  # e.g. plan with auto: Bash may still write
            "tools": [tool["name"] for tool in sandbox.tools_listing()],  # what the model may call now
        }

    @method("session.snapshot", SessionParams)
    async def session_snapshot(self, p: SessionParams) -> dict[str, Any]:
        """The session's file state kept under an id (issue 39): its view, scratch and modes, no process."""
        snapshot_id = await self._session(p.session_id).snapshot()
        return {"session_id": p.session_id, **snapshots.read(snapshot_id).describe()}

    @method("session.restore", SessionRestoreParams)
    async def session_restore(self, p: SessionRestoreParams) -> dict[str, Any]:
        restored = await self._session(p.session_id).restore(p.snapshot_id, force=p.force, turn_id=p.turn_id)
        return {"session_id": p.session_id, **restored}

    @method("session.fork", SessionForkParams)
    async def session_fork(self, p: SessionForkParams) -> dict[str, Any]:
        """``n`` new sessions from this one's state now, each served under its own id."""
        forks = await self._session(p.session_id).fork(p.n, turn_id=p.turn_id)
        opened = [self._opened(fork) for fork in forks]
        return {"session_id": p.session_id, "snapshot_id": forks[0].current_snapshot, "sessions": opened}

    @method("session.changes", SessionParams)
    async def session_changes(self, p: SessionParams) -> dict[str, Any]:
        sandbox = self._session(p.session_id)
        changeset = await sandbox.changes()
        return {
            "session_id": p.session_id,
            "mount": sandbox.jail.mount,
            "counts": changeset.summary(),
            "changes": changeset.to_list(),
            "untracked": changeset.untracked,
        }

    @method("tool.call", ToolCallParams)
    async def tool_call(self, p: ToolCallParams) -> dict[str, Any]:
        sandbox = self._session(p.session_id)
        call_id = p.tool_call_id or ""
        abort = self.aborts.setdefault(call_id, anyio.Event())
        limits = sandbox.profile.limits
        live = LiveOutput(
            self._output(call_id),
            self._withheld(call_id),
            per_stream=limits.live_stream_bytes,
            total=limits.live_total_bytes,
        )
        try:
            async with anyio.create_task_group() as streaming:
                streaming.start_soon(live.run)
                result = await sandbox.call(
                    p.tool,
                    p.args,
                    tool_call_id=call_id,
                    turn_id=p.turn_id,
                    abort=abort,
                    delegate=p.delegate,
                    user_message=p.user_message,
                    on_stdout=live.callback("stdout"),
                    on_stderr=live.callback("stderr"),
                )
                await live.finish()  # every kept byte goes out before the result
        finally:
            self.aborts.pop(call_id, None)
        if p.tool == "Bash":
            result.details["live"] = live.summary()
        return result.model_dump()

    def _output(self, call_id: str) -> Callable[[Stream, bytes], Awaitable[None]]:
        async def send(stream: Stream, chunk: bytes) -> None:
            params = {"tool_call_id": call_id, "stream": stream, "data": chunk.decode("utf-8", errors="replace")}
            await self.writer.send({"jsonrpc": "2.0", "method": "tool.output", "params": params})

        return send

    def _withheld(self, call_id: str) -> Callable[[dict[Stream, int]], Awaitable[None]]:
        async def notice(counts: dict[Stream, int]) -> None:
            params = {"tool_call_id": call_id, "withheld": counts}
            await self.writer.send({"jsonrpc": "2.0", "method": "tool.output.withheld", "params": params})

        return notice

    def _denied(self, event: dict[str, Any]) -> None:
        """A connection an allowlist refused: ``network.denied`` goes out as it happens."""
        if self.tasks is not None:
            self.tasks.start_soon(self._notify, "network.denied", event)

    async def _notify(self, method: str, params: dict[str, Any]) -> None:
        await self.writer.send({"jsonrpc": "2.0", "method": method, "params": params})

    @method("tool.check", ToolCheckParams)
    async def tool_check(self, p: ToolCheckParams) -> dict[str, Any]:
        """The gate, the approval and the audit for a tool the client runs itself: ``ok`` says it may."""
        sandbox = self._session(p.session_id)
        result = await sandbox.check_tool(
            p.tool, p.args, tool_call_id=p.tool_call_id, turn_id=p.turn_id, user_message=p.user_message
        )
        return result.model_dump()

    @method("tools.list", SessionParams)
    async def tools_list(self, p: SessionParams) -> dict[str, Any]:
        """The tools the session's model may call now, each with its JSON Schema."""
        return {"tools": self._session(p.session_id).tools_listing()}

    @method("plugin.list", SessionParams)
    async def plugin_list(self, p: SessionParams) -> dict[str, Any]:
        sandbox = self._session(p.session_id)
        return {"plugins": sandbox.plugins_listing()}

    @method("plugin.register", PluginParams)
    async def plugin_register(self, p: PluginParams) -> dict[str, Any]:
        """Register a declared plugin's tools after the user's grant (an ``approval.request`` with
        operation ``register``); refused, ``registered`` is false and ``reason`` says why."""
        session = self._session(p.session_id)
        return await session.register_plugin(p.plugin_id, turn_id=p.turn_id, tool_call_id=p.tool_call_id)

    @method("tool.cancel", ToolCancelParams)
    async def tool_cancel(self, p: ToolCancelParams) -> dict[str, Any]:
        abort = self.aborts.get(p.tool_call_id)
        if abort is not None:
            abort.set()
        return {"cancelled": abort is not None}

    @method("snapshot.rollback", RollbackParams)
    async def rollback(self, p: RollbackParams) -> dict[str, Any]:
        result = await self._session(p.session_id).rollback(p.snapshot_id)
        return {"ok": result.ok, "path": result.details.get("path"), "content": result.content}

    @method("audit.query", AuditQueryParams)
    async def audit_query(self, p: AuditQueryParams) -> dict[str, Any]:
        log = AuditLog()
        try:
            rows = [r for r in log.rows() if p.session_id is None or r["session_id"] == p.session_id]
        finally:
            log.close()
        return {"records": rows[-p.limit :]}

    @method("changes.list", ChangesListParams)
    async def changes_list(self, p: ChangesListParams) -> dict[str, Any]:
        workspace = Path(p.workspace) if p.workspace is not None else None
        found = await off_loop(changes.listing, workspace)
        return {"changesets": [kept.summary() for kept in found]}

    @method("changes.show", ChangesShowParams)
    async def changes_show(self, p: ChangesShowParams) -> dict[str, Any]:
        kept = await off_loop(changes.load, p.changeset_id)
        return {**kept.to_dict(), "git_lines": kept.git_lines(), "diff": await kept.diff_off_loop(p.paths)}

    @method("changes.apply", ChangesApplyParams)
    async def changes_apply(self, p: ChangesApplyParams) -> dict[str, Any]:
        kept = await off_loop(changes.load, p.changeset_id)
        report = await kept.apply(p.paths, include_flagged=p.include_flagged)
        return {"id": kept.id, "state": kept.state, **report.to_dict()}

    @method("changes.discard", ChangesetParams)
    async def changes_discard(self, p: ChangesetParams) -> dict[str, Any]:
        kept = await off_loop(changes.load, p.changeset_id)
        await off_loop(kept.discard)
        return {}

    @method("shutdown", NoParams)
    async def shutdown(self, _params: NoParams) -> dict[str, Any]:
        await self.close_all()
        return {}

    async def close_all(self) -> None:
        with anyio.CancelScope(shield=True):
            for sandbox in list(self.sessions.values()):
                with contextlib.suppress(SandboxError):
                    await sandbox.aclose()
                if sandbox.changeset_id is not None:  # no session.close answered it: say it where a user looks
                    sys.stderr.write(
                        f"sandbox serve: session {sandbox.session_id}'s changes are kept as {sandbox.changeset_id}: "
                        f"sandbox changes show {sandbox.changeset_id}; sandbox changes apply {sandbox.changeset_id}\n"
                    )
            self.sessions.clear()


async def serve(
    stdin_fd: int = 0,
    stdout_fd: int = 1,
    pending: bytes = b"",
    plugins: list[plugin_tools.Plugin] | None = None,
    granted: list[str] | None = None,
) -> int:
    """Serve until ``shutdown`` or the end of stdin; ``pending`` is input already read from it."""
    writer = Writer(stdout_fd)
    server = Server(writer, plugins, granted)
    lines = Lines(FdReceiveStream(stdin_fd), MAX_LINE, pending)
    try:
        async with anyio.create_task_group() as tg:
            server.tasks = tg

            async def read_lines() -> None:
                with contextlib.suppress(anyio.EndOfStream):
                    while True:
                        line = await lines.receive()
                        if line is None or line and not line.isspace():
                            tg.start_soon(server.dispatch, line)
                        await anyio.lowlevel.checkpoint()  # a burst of lines: let each start before the next
                server.client_gone()

            tg.start_soon(read_lines)
            tg.start_soon(end_on_signal, server.stop.set)  # SIGTERM, SIGHUP, SIGINT: as a shutdown
            await server.stop.wait()
            tg.cancel_scope.cancel()
    finally:
        await server.close_all()
    return 0


def main(
    pending: bytes = b"", plugins: list[plugin_tools.Plugin] | None = None, granted: list[str] | None = None
) -> int:
    return anyio.run(serve, 0, 1, pending, plugins, granted)
