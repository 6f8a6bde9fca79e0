"""A scripted chat-completions model on loopback, for the classifier's built-in client.

``POST /v1/chat/completions``: the classifier's request (the JSON of the last message) goes to
``respond``, which says the HTTP status and the assistant's content; every request, its body and
its headers are kept. Used as a context manager: the server runs in a thread while inside.
"""

from __future__ import annotations

import http.server
import json
import threading
from typing import TYPE_CHECKING, Any, Self

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import TracebackType


class ChatServer:
    def __init__(self, respond: Callable[[dict[str, Any]], tuple[int, str]]) -> None:
        self.respond = respond
        self.seen: list[dict[str, Any]] = []
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *_args: object) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.bodies.append(body)
                outer.headers.append(dict(self.headers))
                request = json.loads(body["messages"][-1]["content"])
                outer.seen.append(request)
                status, content = outer.respond(request)
                if status != 200:
                    self.send_response(status)
                    self.end_headers()
                    self.wfile.write(content.encode())
                    return
                reply = {"id": "x", "object": "chat.completion", "model": body.get("model")}
                reply["choices"] = [{"index": 0, "message": {"role": "assistant", "content": content}}]
                data = json.dumps(reply).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self) -> Self:
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
