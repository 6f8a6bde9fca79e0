"""SIGTERM, SIGHUP and SIGINT end ``sandbox serve`` and ``sandbox mcp`` as a closed stdin does (issue 33).

Real clients end the server they started with a signal (Codex, Gemini CLI and opencode: SIGTERM;
a closing terminal: SIGHUP; Claude Code: SIGINT, then SIGTERM). Whichever, a copy session's work
is kept as a changeset, its id said on stderr, and the server exits of its own accord.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from sandbox import changes
from tests.conftest import backend_or_skip

if TYPE_CHECKING:
    from collections.abc import Callable

pytestmark = [pytest.mark.bwrap, pytest.mark.timeout(90)]
SANDBOX = str(Path(sys.executable).with_name("sandbox"))
KEPT = re.compile(r"\b(ch-[0-9a-f]{12})\b")
SIGNALS = [pytest.param(s, id=s.name) for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)]
WRITE = "echo work > made.txt"


class Line:
    """One JSON object per line over a child's stdin and stdout."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdin is not None and proc.stdout is not None
        self.proc, self.stdin, self.stdout = proc, proc.stdin, proc.stdout

    def send(self, message: dict[str, Any]) -> None:
        self.stdin.write(json.dumps(message) + "\n")
        self.stdin.flush()

    def reply(self, rid: int) -> dict[str, Any]:
        while True:
            line = self.stdout.readline()
            assert line, "the server closed stdout"
            message: dict[str, Any] = json.loads(line)
            if message.get("id") == rid and ("result" in message or "error" in message):
                return message


def _serve(workspace: Path) -> tuple[subprocess.Popen[str], Line]:
    proc = subprocess.Popen(
        [SANDBOX, "serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    rpc = Line(proc)
    rpc.send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}})
    rpc.reply(1)
    params = {"workspace": str(workspace), "backend": "bwrap", "mount": "copy", "mode": "auto"}
    rpc.send({"jsonrpc": "2.0", "id": 2, "method": "session.open", "params": params})
    sid = rpc.reply(2)["result"]["session_id"]
    call = {"session_id": sid, "tool": "Bash", "args": {"command": WRITE}}
    rpc.send({"jsonrpc": "2.0", "id": 3, "method": "tool.call", "params": call})
    assert rpc.reply(3)["result"]["ok"]
    return proc, rpc


def _mcp(workspace: Path) -> tuple[subprocess.Popen[str], Line]:
    argv = [SANDBOX, "mcp", "--backend", "bwrap", "--mount", "copy", "--mode", "auto", "--workspace", str(workspace)]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    rpc = Line(proc)
    hello = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}
    rpc.send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": hello})
    rpc.reply(1)
    rpc.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    call = {"name": "Bash", "arguments": {"command": WRITE}}
    rpc.send({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": call})
    assert not rpc.reply(2)["result"].get("isError"), "the Bash call failed"
    return proc, rpc


@pytest.mark.parametrize("start", [pytest.param(_serve, id="serve"), pytest.param(_mcp, id="mcp")])
@pytest.mark.parametrize("signum", SIGNALS)
def test_a_signal_keeps_the_copy_sessions_work(
    start: Callable[[Path], tuple[subprocess.Popen[str], Line]], signum: signal.Signals, workspace: Path
) -> None:
    backend_or_skip("bwrap")
    proc, _rpc = start(workspace)
    os.kill(proc.pid, signum)
    try:
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    found = KEPT.search(err)
    assert found, f"exit {proc.returncode}; stderr:\n{err}"
    kept = changes.load(found[1])
    assert [e.change.path for e in kept.entries] == ["made.txt"]
    assert not (workspace / "made.txt").exists()  # kept, not applied
    assert proc.returncode is not None and proc.returncode >= 0, "ended by the signal's default action"
