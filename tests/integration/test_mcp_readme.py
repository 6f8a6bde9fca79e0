"""The MCP client snippets of docs/guides/agent-tools.md parse in their clients' formats and start `sandbox mcp`.

Each snippet follows a ``<!-- mcp-snippet: NAME -->`` marker: Claude Code's ``.mcp.json`` and
Gemini CLI's ``settings.json`` (JSON, ``mcpServers``), Codex CLI's ``config.toml`` (TOML,
``[mcp_servers.*]``), opencode's ``opencode.json`` (JSON, ``mcp``), the headless command lines and
the Python agent (compiled, and checked to use the SDK's stdio client). test_agents.py runs the
four clients from these very snippets.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from sandbox.cli import build_parser
from tests.conftest import backend_or_skip

PAGE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "agent-tools.md"
SNIPPET = re.compile(r"<!-- mcp-snippet: (?P<name>[\w-]+) -->\n```(?P<lang>\w+)\n(?P<body>.*?)\n```", re.S)


def snippets() -> dict[str, tuple[str, str]]:
    return {m["name"]: (m["lang"], m["body"]) for m in SNIPPET.finditer(PAGE.read_text())}


def assert_starts_sandbox_mcp(server: dict[str, Any]) -> None:
    assert server["command"] == "sandbox" and server["args"][0] == "mcp", server
    args = build_parser().parse_args(server["args"])  # every flag is one `sandbox mcp` takes
    assert args.command == "mcp"


def assert_http(server: dict[str, Any], url_key: str) -> None:
    assert server[url_key] == "http://127.0.0.1:8765/mcp"


def test_every_client_has_a_snippet() -> None:
    assert set(snippets()) == {"claude-code", "codex", "gemini", "opencode", "headless", "python"}


def test_claude_code_mcp_json() -> None:
    lang, body = snippets()["claude-code"]
    servers = json.loads(body)["mcpServers"]
    assert lang == "json" and servers["sandbox"]["type"] == "stdio"
    assert_starts_sandbox_mcp(servers["sandbox"])
    http = servers["sandbox-http"]
    assert http["type"] == "http" and http["headers"]["Authorization"] == "Bearer ${SANDBOX_MCP_TOKEN}"
    assert_http(http, "url")


def test_codex_config_toml() -> None:
    lang, body = snippets()["codex"]
    servers = tomllib.loads(body)["mcp_servers"]
    assert lang == "toml"
    assert_starts_sandbox_mcp(servers["sandbox"])
    assert servers["sandbox-http"]["bearer_token_env_var"] == "SANDBOX_MCP_TOKEN"
    assert_http(servers["sandbox-http"], "url")


def test_gemini_settings_json() -> None:
    lang, body = snippets()["gemini"]
    servers = json.loads(body)["mcpServers"]
    assert lang == "json"
    assert_starts_sandbox_mcp(servers["sandbox"])
    assert_http(servers["sandbox-http"], "httpUrl")


def test_opencode_json() -> None:
    lang, body = snippets()["opencode"]
    local = json.loads(body)["mcp"]["sandbox"]
    assert lang == "json" and local["type"] == "local" and local["enabled"] is True
    assert_starts_sandbox_mcp({"command": local["command"][0], "args": local["command"][1:]})


def test_headless_command_lines() -> None:
    lang, body = snippets()["headless"]
    assert lang == "sh"
    assert [shlex.split(line)[0] for line in body.splitlines()] == ["claude", "codex", "gemini", "opencode"]


@pytest.mark.parametrize("needed", ["stdio_client", "ClientSession", "elicitation_callback", "call_tool"])
def test_python_agent(needed: str) -> None:
    lang, body = snippets()["python"]
    tree = ast.parse(body)
    assert lang == "python" and needed in body
    calls = [
        n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "StdioServerParameters"
    ]
    args = next(k.value for k in calls[0].keywords if k.arg == "args")
    assert isinstance(args, ast.List)
    server = {"command": "sandbox", "args": [ast.literal_eval(e) for e in args.elts]}
    assert_starts_sandbox_mcp(server)


@pytest.mark.bwrap
def test_python_agent_runs_against_the_real_server(workspace: Path, tmp_path: Path) -> None:
    backend_or_skip("bwrap")
    script = tmp_path / "agent.py"
    script.write_text(snippets()["python"][1])
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run(
        [sys.executable, str(script)], cwd=workspace, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "False" in done.stdout and "README.md" in done.stdout and "done" in done.stdout
