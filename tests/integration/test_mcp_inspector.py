"""``sandbox mcp`` driven by a second real client: the MCP Inspector's command-line mode (npm
``@modelcontextprotocol/inspector``, installed by ``make test`` into tests/mcp-inspector).

Each test is one Inspector process speaking stdio to a real server: the tool list and its
schemas, every tool on both backends with stdout and stderr apart, a path outside the workspace
through every file tool as an error result, never a protocol crash. (The Inspector refuses an
unknown tool itself, from the listing, so unknown tools and malformed requests are tested with
the SDK's client in test_mcp.py.)
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import backend_or_skip, own_like_a_checkout

pytestmark = pytest.mark.npm
SANDBOX = str(Path(sys.executable).with_name("sandbox"))
INSPECTOR = Path(__file__).resolve().parents[1] / "mcp-inspector" / "node_modules" / ".bin" / "mcp-inspector"
BACKENDS = [pytest.param("bwrap", marks=pytest.mark.bwrap), pytest.param("docker", marks=pytest.mark.docker)]
TOOLS = {"Bash", "Read", "Write", "Edit", "Glob", "Grep", "LS"}


def inspect(workspace: Path, backend: str, *method: str, mode: str = "auto") -> Any:
    if not INSPECTOR.exists():
        pytest.fail(f"the MCP Inspector is not installed at {INSPECTOR}: `make test` installs it (make mcp-inspector)")
    server = [SANDBOX, "mcp", "--workspace", str(workspace), "--backend", backend, "--mode", mode]
    done = subprocess.run(
        [str(INSPECTOR), "--cli", *server, *method], capture_output=True, text=True, timeout=120, check=False
    )
    # The Inspector exits 5 when the tool's result is an error; the result is printed all the same.
    assert done.returncode in (0, 5), done.stderr
    return json.loads(done.stdout)


def call(workspace: Path, backend: str, tool: str, mode: str = "auto", **args: str) -> Any:
    pairs = [f"{key}={value}" for key, value in args.items()]
    method = ("--method", "tools/call", "--tool-name", tool, "--tool-arg", *pairs)
    return inspect(workspace, backend, *method, mode=mode)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, workspace: Path) -> str:
    backend_or_skip(request.param)
    if request.param == "docker":
        own_like_a_checkout(workspace)
    return str(request.param)


def test_the_tool_list_and_its_schemas(workspace: Path) -> None:
    backend_or_skip("bwrap")
    listed = {tool["name"]: tool for tool in inspect(workspace, "bwrap", "--method", "tools/list")["tools"]}
    assert set(listed) >= TOOLS
    bash = listed["Bash"]["inputSchema"]
    assert bash["required"] == ["command"] and bash["properties"]["timeout"]["type"] == "number"
    assert listed["Read"]["inputSchema"]["required"] == ["path"]
    assert all(listed[name]["description"] for name in TOOLS)


def test_every_tool_runs_in_the_jail_with_streams_apart(backend: str, workspace: Path) -> None:
    bash = call(workspace, backend, "Bash", command="echo out; echo err >&2; id -u")
    data = bash["structuredContent"]
    assert data["ok"] and data["stdout"].startswith("out\n") and data["stderr"] == "err\n"
    assert data["stdout"].split()[1] != "0"  # never root in the jail
    assert data["details"]["backend"] == backend
    assert call(workspace, backend, "Write", path="notes.txt", content="alpha")["structuredContent"]["ok"]
    edit = call(workspace, backend, "Edit", path="notes.txt", edits='[{"old_text": "alpha", "new_text": "beta"}]')
    assert edit["structuredContent"]["ok"], edit
    assert "beta" in call(workspace, backend, "Read", path="notes.txt")["content"][0]["text"]
    assert "notes.txt" in call(workspace, backend, "Glob", pattern="*.txt")["content"][0]["text"]
    assert "notes.txt" in call(workspace, backend, "Grep", pattern="beta")["content"][0]["text"]
    assert "notes.txt" in call(workspace, backend, "LS", path=".")["content"][0]["text"]
    assert (workspace / "notes.txt").read_text() == "beta"


@pytest.mark.bwrap
@pytest.mark.parametrize(
    ("tool", "args"),
    [
        ("Read", {"path": "/etc/shadow"}),
        ("Write", {"path": "/tmp/outside.txt", "content": "x"}),
        ("Edit", {"path": "/etc/hostname", "edits": '[{"old_text": "a", "new_text": "b"}]'}),
        ("Glob", {"pattern": "/root/**"}),
        ("Grep", {"pattern": "x", "path": "/root"}),
        ("LS", {"path": "/root"}),
    ],
)
def test_a_path_outside_the_workspace_is_an_error_result(workspace: Path, tool: str, args: dict[str, str]) -> None:
    """In ``ask`` mode, with a client that cannot be asked (the Inspector's CLI has no elicitation)."""
    backend_or_skip("bwrap")
    result = call(workspace, "bwrap", tool, "ask", **args)
    assert result.get("isError") is True, result
    assert result["structuredContent"]["error_code"] in ("TOOL_DENIED", "INVALID_ARGUMENT"), result
