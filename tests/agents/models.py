"""Scripted model servers on loopback, one per wire format the agents speak.

Each server plays a short script: while the conversation holds fewer tool results than the script
has steps, the model asks for the next step's tool call; then it answers with text echoing the last
tool result it was given. The step is chosen by counting the tool results in the request (every
client resends the whole conversation), so a client may retry or interleave side requests (a title,
a router, a next-speaker check) without derailing the script. A request that offers none of the
script's tools is such a side request and gets a short plain answer.

Every request is recorded (:attr:`ModelServer.requests`) with its path and JSON body, and every
tool result the clients forwarded is extracted as they sent it (:meth:`ModelServer.tool_results`),
so a test sees exactly what the model was shown.

- :class:`AnthropicServer`: the Messages API, streaming SSE (Claude Code).
- :class:`ResponsesServer`: OpenAI's Responses API, streaming SSE (Codex CLI).
- :class:`GeminiServer`: ``generateContent`` / ``streamGenerateContent`` (Gemini CLI).
- :class:`ChatServer`: OpenAI-compatible chat completions, streaming SSE (opencode).
"""

from __future__ import annotations

import dataclasses
import http.server
import itertools
import json
import threading
from typing import TYPE_CHECKING, Any, ClassVar, Self

if TYPE_CHECKING:
    from collections.abc import Iterable
    from types import TracebackType

Event = tuple[str | None, Any]  # an SSE event: its name (or None) and its data (JSON, or a raw string)
DONE_TEXT = "SCRIPT-DONE"
NAMESPACE = "::"  # between a Responses namespace and a tool inside it, in the names a script offers


@dataclasses.dataclass(frozen=True)
class Step:
    """One tool call the model asks for: the sandbox tool's own name and its arguments."""

    tool: str
    args: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Recorded:
    path: str
    body: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Turn:
    """What the script says next: a tool call (its name as the client offered it), or the last text."""

    tool: str | None
    args: dict[str, Any]
    text: str
    call_id: str


class ModelServer:
    """A threaded HTTP server on 127.0.0.1 playing ``steps``; a context manager (the thread runs inside)."""

    api: ClassVar[str] = ""
    # Whether the client may offer an MCP tool under its bare name (Gemini CLI, when no name of its
    # own clashes); elsewhere a bare ``Bash`` or ``Read`` is the client's built-in, never ours.
    bare_names: ClassVar[bool] = False

    def __init__(self, steps: Iterable[Step]) -> None:
        self.steps = list(steps)
        self.requests: list[Recorded] = []
        self.errors: list[str] = []
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Self:
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object | TracebackType | None) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    # What each API says differently: the offered tool names, the tool results in the conversation,
    # and how a turn is written.
    def tool_names(self, body: dict[str, Any]) -> list[str]:
        raise NotImplementedError

    def results_in(self, body: dict[str, Any]) -> list[Any]:
        raise NotImplementedError

    def reply(self, path: str, body: dict[str, Any], turn: Turn | None) -> tuple[dict[str, Any] | None, list[Event]]:
        """A JSON body (not streaming) or SSE events for ``turn`` (None: a side request)."""
        raise NotImplementedError

    def answer_get(self, path: str) -> dict[str, Any] | None:
        del path
        return None

    # The script.
    def offered(self, body: dict[str, Any], tool: str) -> str | None:
        """The client's name for the sandbox's ``tool`` among those offered (``mcp__sandbox__Read``,
        ``sandbox_Read``, ``Read``): a name naming the server first, else the bare name."""
        names = self.tool_names(body)
        for name in names:
            if "sandbox" in name and name.endswith((f"_{tool}", f"{NAMESPACE}{tool}")):
                return name
        return tool if self.bare_names and tool in names else None

    def turn(self, body: dict[str, Any]) -> Turn | None:
        results = self.results_in(body)
        call_id = f"call_{next(self._ids)}"
        if self.steps and self.offered(body, self.steps[0].tool) is None and not results:
            return None
        if len(results) < len(self.steps):
            step = self.steps[len(results)]
            name = self.offered(body, step.tool)
            if name is None:
                self.errors.append(f"{step.tool} was not offered: {self.tool_names(body)}")
                return Turn(None, {}, f"the tool {step.tool} was not offered", call_id)
            return Turn(name, step.args, "", call_id)
        last = json.dumps(results[-1]) if results else ""
        return Turn(None, {}, f"{DONE_TEXT} last result: {last[:4000]}", call_id)

    def tool_results(self) -> list[Any]:
        """The tool results of the longest conversation any request carried, as the client sent them."""
        best: list[Any] = []
        for recorded in self.requests:
            found = self.results_in(recorded.body)
            if len(found) > len(best):
                best = found
        return best

    def offered_tools(self) -> list[str]:
        names: set[str] = set()
        for recorded in self.requests:
            names.update(self.tool_names(recorded.body))
        return sorted(names)

    def _handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_args: object) -> None:
                pass

            def do_GET(self) -> None:
                reply = outer.answer_get(self.path)
                self._json(reply if reply is not None else {"error": "not found"}, 200 if reply is not None else 404)

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    body = {"unparsed": raw.decode(errors="replace")}
                with outer._lock:
                    outer.requests.append(Recorded(self.path, body))
                    try:
                        turn = outer.turn(body)
                        whole, events = outer.reply(self.path, body, turn)
                    except Exception as exc:  # a script bug must show in the test, not as a hung client
                        outer.errors.append(f"{type(exc).__name__}: {exc} on {self.path}")
                        self._json({"error": {"message": str(exc)}}, 500)
                        return
                if whole is not None:
                    self._json(whole)
                else:
                    self._stream(events)

            def _json(self, payload: dict[str, Any], status: int = 200) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _stream(self, events: list[Event]) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Connection", "close")
                self.end_headers()
                for name, data in events:
                    head = f"event: {name}\n" if name else ""
                    payload = data if isinstance(data, str) else json.dumps(data)
                    self.wfile.write(f"{head}data: {payload}\n\n".encode())
                    self.wfile.flush()
                self.close_connection = True

        return Handler


class AnthropicServer(ModelServer):
    """``POST /v1/messages`` (streaming or not) and ``/v1/messages/count_tokens``."""

    api = "anthropic"

    def tool_names(self, body: dict[str, Any]) -> list[str]:
        return [str(tool.get("name")) for tool in body.get("tools") or []]

    def results_in(self, body: dict[str, Any]) -> list[Any]:
        return [
            block
            for message in body.get("messages") or []
            if isinstance(message.get("content"), list)
            for block in message["content"]
            if isinstance(block, dict) and block.get("type") == "tool_result"
        ]

    def reply(self, path: str, body: dict[str, Any], turn: Turn | None) -> tuple[dict[str, Any] | None, list[Event]]:
        if "count_tokens" in path:
            return {"input_tokens": 10}, []
        text = "ok" if turn is None else turn.text
        block: dict[str, Any]
        if turn is not None and turn.tool is not None:
            block = {"type": "tool_use", "id": f"toolu_{turn.call_id}", "name": turn.tool, "input": turn.args}
        else:
            block = {"type": "text", "text": text}
        stop = "tool_use" if block["type"] == "tool_use" else "end_turn"
        usage = {"input_tokens": 10, "output_tokens": 5}
        message: dict[str, Any] = {
            "id": f"msg_{next(self._ids)}",
            "type": "message",
            "role": "assistant",
            "model": body.get("model"),
        }
        if not body.get("stream"):
            return {**message, "content": [block], "stop_reason": stop, "stop_sequence": None, "usage": usage}, []
        start = {**message, "content": [], "stop_reason": None, "stop_sequence": None, "usage": usage}
        if block["type"] == "tool_use":
            opened = {**block, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(turn.args if turn else {})}
        else:
            opened = {"type": "text", "text": ""}
            delta = {"type": "text_delta", "text": text}
        return None, [
            ("message_start", {"type": "message_start", "message": start}),
            ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": opened}),
            ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}),
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
            (
                "message_delta",
                {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None}, "usage": usage},
            ),
            ("message_stop", {"type": "message_stop"}),
        ]


class ResponsesServer(ModelServer):
    """``POST /v1/responses`` streaming (Codex CLI's ``wire_api = "responses"``)."""

    api = "responses"

    def tool_names(self, body: dict[str, Any]) -> list[str]:
        names: list[str] = []
        for tool in body.get("tools") or []:
            if tool.get("type") == "namespace":  # Codex offers an MCP server's tools as one namespace
                names.extend(f"{tool['name']}{NAMESPACE}{inner.get('name')}" for inner in tool.get("tools") or [])
            elif tool.get("name"):
                names.append(str(tool["name"]))
        return names

    def results_in(self, body: dict[str, Any]) -> list[Any]:
        items: list[Any] = body["input"] if isinstance(body.get("input"), list) else []
        return [item for item in items if isinstance(item, dict) and str(item.get("type", "")).endswith("_output")]

    def answer_get(self, path: str) -> dict[str, Any] | None:
        return {"object": "list", "data": [{"id": "scripted", "object": "model"}]} if "models" in path else None

    def reply(self, path: str, body: dict[str, Any], turn: Turn | None) -> tuple[dict[str, Any] | None, list[Event]]:
        del path
        rid = f"resp_{next(self._ids)}"
        item: dict[str, Any]
        if turn is not None and turn.tool is not None:
            item = {
                "type": "function_call",
                "id": f"fc_{turn.call_id}",
                "call_id": turn.call_id,
                "name": turn.tool,
                "arguments": json.dumps(turn.args),
                "status": "completed",
            }
            if NAMESPACE in turn.tool:
                item["namespace"], item["name"] = turn.tool.split(NAMESPACE, 1)
        else:
            text = "ok" if turn is None else turn.text
            content = [{"type": "output_text", "text": text, "annotations": []}]
            item = {
                "type": "message",
                "id": f"msg_{rid}",
                "role": "assistant",
                "status": "completed",
                "content": content,
            }
        usage = {
            "input_tokens": 10,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 5,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 15,
        }
        response: dict[str, Any] = {
            "id": rid,
            "object": "response",
            "model": body.get("model"),
            "status": "in_progress",
        }
        response["output"] = []
        events: list[Event] = [("response.created", {"type": "response.created", "response": response})]
        added = {"type": "response.output_item.added", "output_index": 0, "item": {**item, "status": "in_progress"}}
        events.append(("response.output_item.added", added))
        if item["type"] == "message":
            delta = {"type": "response.output_text.delta", "item_id": item["id"], "output_index": 0}
            events.append(("response.output_text.delta", {**delta, "content_index": 0, "delta": content[0]["text"]}))
        events.append(
            ("response.output_item.done", {"type": "response.output_item.done", "output_index": 0, "item": item})
        )
        done = {**response, "status": "completed", "output": [item], "usage": usage}
        events.append(("response.completed", {"type": "response.completed", "response": done}))
        return None, events


class GeminiServer(ModelServer):
    """``POST /v1beta/models/M:generateContent`` and ``:streamGenerateContent?alt=sse``, ``:countTokens``."""

    api = "gemini"
    bare_names = True
    # Gemini CLI's side requests ask for JSON (the router's classifiers, the next-speaker check):
    # one object satisfies them all.
    SIDE_JSON: ClassVar[dict[str, str | int]] = {
        "reasoning": "scripted",
        "next_speaker": "user",
        "model_choice": "flash",
        "complexity_reasoning": "scripted",
        "complexity_score": 10,
    }

    def tool_names(self, body: dict[str, Any]) -> list[str]:
        return [
            str(decl.get("name"))
            for tool in body.get("tools") or []
            for decl in tool.get("functionDeclarations") or tool.get("function_declarations") or []
        ]

    def results_in(self, body: dict[str, Any]) -> list[Any]:
        return [
            part["functionResponse"]
            for content in body.get("contents") or []
            for part in content.get("parts") or []
            if isinstance(part, dict) and "functionResponse" in part
        ]

    def reply(self, path: str, body: dict[str, Any], turn: Turn | None) -> tuple[dict[str, Any] | None, list[Event]]:
        if ":countTokens" in path:
            return {"totalTokens": 10}, []
        config = body.get("generationConfig") or {}
        part: dict[str, Any]
        if turn is not None and turn.tool is not None:
            part = {"functionCall": {"name": turn.tool, "args": turn.args}}
        elif turn is None and config.get("responseMimeType") == "application/json":
            part = {"text": json.dumps(self.SIDE_JSON)}
        else:
            part = {"text": "ok" if turn is None else turn.text}
        usage = {"promptTokenCount": 10, "candidatesTokenCount": 5, "totalTokenCount": 15}
        candidate = {"content": {"role": "model", "parts": [part]}, "finishReason": "STOP", "index": 0}
        whole = {"candidates": [candidate], "usageMetadata": usage, "modelVersion": "scripted"}
        if ":streamGenerateContent" in path:
            return None, [(None, whole)]
        return whole, []


class ChatServer(ModelServer):
    """``POST /v1/chat/completions``, streaming or not (an OpenAI-compatible provider: opencode)."""

    api = "chat"

    def tool_names(self, body: dict[str, Any]) -> list[str]:
        return [str((tool.get("function") or {}).get("name")) for tool in body.get("tools") or []]

    def results_in(self, body: dict[str, Any]) -> list[Any]:
        return [message for message in body.get("messages") or [] if message.get("role") == "tool"]

    def answer_get(self, path: str) -> dict[str, Any] | None:
        return {"object": "list", "data": [{"id": "scripted", "object": "model"}]} if "models" in path else None

    def reply(self, path: str, body: dict[str, Any], turn: Turn | None) -> tuple[dict[str, Any] | None, list[Event]]:
        del path
        message: dict[str, Any] = {"role": "assistant", "content": None}
        if turn is not None and turn.tool is not None:
            function = {"name": turn.tool, "arguments": json.dumps(turn.args)}
            call = {"id": turn.call_id, "type": "function", "function": function}
            message["tool_calls"] = [call]
            finish = "tool_calls"
        else:
            message["content"] = "ok" if turn is None else turn.text
            finish = "stop"
        usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
        head = {"id": f"chatcmpl-{next(self._ids)}", "created": 0, "model": body.get("model")}
        if not body.get("stream"):
            choice = {"index": 0, "message": message, "finish_reason": finish}
            return {**head, "object": "chat.completion", "choices": [choice], "usage": usage}, []
        chunk = {**head, "object": "chat.completion.chunk"}
        delta = dict(message)
        if "tool_calls" in delta:
            delta["tool_calls"] = [{"index": 0, **call} for call in delta["tool_calls"]]
        return None, [
            (None, {**chunk, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}),
            (None, {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}),
            (None, {**chunk, "choices": [], "usage": usage}),
            (None, "[DONE]"),
        ]
