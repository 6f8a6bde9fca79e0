"""``sandbox mcp`` under the agents people use: Claude Code, Codex CLI, Gemini CLI and opencode.

Each client is the real one, installed from npm at a pinned version (``make agents``:
tests/agents/package.json), run headless against a scripted model on loopback speaking its own API
(tests/agents/models.py), with ``sandbox mcp`` on bubblewrap as its MCP server. The model asks for
Bash (stdout and stderr), Read, Write in the workspace and Write outside it, one tool call a turn,
then ends; every request the client sent is recorded, so the tests read exactly what the client
showed the model after each call. One run per client serves every test.

Each client's HOME and XDG directories are a temporary directory: nothing of this machine's user
configuration is read or written. A client that is not installed, or that cannot start here, is
skipped with the reason; a run that starts and goes wrong fails.

What each forwards to the model (the reason ``structuredContent`` carries ``text``): Claude Code
sends a successful result's ``structuredContent`` as JSON and an error's text; Codex CLI sends
``structuredContent`` as JSON, error or not; Gemini CLI and opencode send ``content``'s text
(Gemini CLI quotes the raw result, both parts, for an error).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.agents import models
from tests.conftest import backend_or_skip

if TYPE_CHECKING:
    from collections.abc import Callable

pytestmark = [pytest.mark.npm, pytest.mark.slow, pytest.mark.bwrap]

AGENTS = Path(__file__).resolve().parents[1] / "agents"
BIN = AGENTS / "node_modules" / ".bin"
SANDBOX = str(Path(sys.executable).with_name("sandbox"))
TOOLS = ("Bash", "Read", "Write", "Edit", "Glob", "Grep", "LS")
PROMPT = "Use the sandbox's tools as the task needs."
NOTES = "alpha\nbeta\n"
NUMBERED = "     1\talpha\n     2\tbeta"


@dataclasses.dataclass
class Run:
    """One headless run of a client through the script: what it printed, what the model was shown."""

    client: str
    root: Path
    workspace: Path
    outside: Path
    server: models.ModelServer
    done: subprocess.CompletedProcess[str]

    def shown(self, step: int) -> str:
        """Everything the model was shown after the script's ``step``-th call, JSON unfolded."""
        results = self.server.tool_results()
        assert len(results) > step, (self.client, results, self.done.stdout[-3000:], self.done.stderr[-3000:])
        return readable(results[step])

    def structured(self, step: int) -> dict[str, Any] | None:
        """The ``structuredContent`` the model was shown after ``step``, when the client sent it."""
        return _find_structured(self.server.tool_results()[step])


def steps(outside: Path) -> list[models.Step]:
    return [
        models.Step("Bash", {"command": "echo out; echo err >&2"}),
        models.Step("Read", {"path": "notes.txt"}),
        models.Step("Write", {"path": "new.txt", "content": "written\n"}),
        models.Step("Write", {"path": str(outside), "content": "x"}),
    ]


BASH, READ, WRITE, OUTSIDE = range(4)


# How each client is configured and started. Each gets the workspace as its working directory, a
# server command (``sandbox mcp`` on bubblewrap) and the model's URL; it writes its configuration
# under ``root`` / its temporary HOME and returns its argv and the environment it needs beyond HOME.
Setup = tuple[list[str], dict[str, str]]


def claude(root: Path, home: Path, server: list[str], url: str) -> Setup:
    config = root / "mcp.json"
    entry = {"type": "stdio", "command": server[0], "args": server[1:]}
    config.write_text(json.dumps({"mcpServers": {"sandbox": entry}}))
    env = {
        "ANTHROPIC_BASE_URL": url,
        "ANTHROPIC_API_KEY": "sk-scripted",
        "CLAUDE_CONFIG_DIR": str(home / ".claude"),
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        # Else MCP tools are deferred behind its ToolSearch tool and the model is offered none of ours.
        "ENABLE_TOOL_SEARCH": "false",
    }
    argv = [str(BIN / "claude"), "-p", PROMPT, "--mcp-config", str(config), "--strict-mcp-config"]
    # -p asks no one: a tool not allowed here is refused by Claude Code before it reaches the server.
    return [*argv, "--allowedTools", "mcp__sandbox", "--output-format", "stream-json", "--verbose"], env


def codex(root: Path, home: Path, server: list[str], url: str) -> Setup:
    del root
    codex_home = home / ".codex"
    codex_home.mkdir(parents=True)
    (codex_home / "config.toml").write_text(
        f"""model = "scripted"
model_provider = "scripted"
approval_policy = "never"

[model_providers.scripted]
name = "scripted"
base_url = "{url}/v1"
wire_api = "responses"
env_key = "SCRIPTED_API_KEY"

[mcp_servers.sandbox]
command = {json.dumps(server[0])}
args = {json.dumps(server[1:])}
# Without it codex exec may send its first request before the server has listed its tools.
required = true
# Without it every tool not annotated read-only (Bash, Write, Edit) is refused under "never".
default_tools_approval_mode = "approve"
"""
    )
    argv = [str(BIN / "codex"), "exec", "--skip-git-repo-check", "--json", PROMPT]
    return argv, {"CODEX_HOME": str(codex_home), "SCRIPTED_API_KEY": "sk-scripted"}


def gemini(root: Path, home: Path, server: list[str], url: str) -> Setup:
    del root
    settings = {
        "mcpServers": {"sandbox": {"command": server[0], "args": server[1:], "trust": True, "timeout": 600000}},
        # GOOGLE_GEMINI_BASE_URL alone selects the "gateway" auth, which -p refuses as invalid.
        "security": {"auth": {"selectedType": "gemini-api-key"}},
        "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False},
    }
    (home / ".gemini").mkdir(parents=True)
    (home / ".gemini" / "settings.json").write_text(json.dumps(settings))
    argv = [str(BIN / "gemini"), "-p", PROMPT, "--yolo", "--skip-trust", "--output-format", "stream-json"]
    return argv, {"GOOGLE_GEMINI_BASE_URL": url, "GEMINI_API_KEY": "scripted"}


def opencode(root: Path, home: Path, server: list[str], url: str) -> Setup:
    del home
    provider = {
        "npm": "@ai-sdk/openai-compatible",
        "name": "Scripted",
        "options": {"baseURL": f"{url}/v1", "apiKey": "sk-scripted"},
        "models": {"scripted": {"name": "Scripted", "tool_call": True}},
    }
    config = {
        "$schema": "https://opencode.ai/config.json",
        "provider": {"scripted": provider},
        "model": "scripted/scripted",
        "small_model": "scripted/scripted",
        "mcp": {"sandbox": {"type": "local", "command": server, "enabled": True}},
        "autoupdate": False,
        "share": "disabled",
    }
    (root / "opencode.json").write_text(json.dumps(config))
    env = {
        "OPENCODE_CONFIG": str(root / "opencode.json"),
        "OPENCODE_DISABLE_MODELS_FETCH": "1",
        "OPENCODE_DISABLE_AUTOUPDATE": "1",
        "OPENCODE_DISABLE_SHARE": "1",
        "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
        "OPENCODE_DISABLE_CLAUDE_CODE": "1",
        # At start it npm-installs its plugin package into its config dir; it runs on without it,
        # so the run never depends on a registry.
        "npm_config_registry": "http://127.0.0.1:9/",
    }
    return [str(BIN / "opencode"), "run", "--format", "json", PROMPT], env


CLIENTS: dict[str, tuple[Callable[[Path, Path, list[str], str], Setup], type[models.ModelServer]]] = {
    "claude-code": (claude, models.AnthropicServer),
    "codex": (codex, models.ResponsesServer),
    "gemini-cli": (gemini, models.GeminiServer),
    "opencode": (opencode, models.ChatServer),
}
EXECUTABLE = {"claude-code": "claude", "codex": "codex", "gemini-cli": "gemini", "opencode": "opencode"}


def private_env(root: Path, home: Path) -> dict[str, str]:
    """HOME, XDG and the sandbox's data dir under ``root``; npm's ``node`` first on PATH."""
    dirs = {
        "XDG_CONFIG_HOME": home / ".config",
        "XDG_DATA_HOME": home / ".local" / "share",
        "XDG_CACHE_HOME": home / ".cache",
        "XDG_STATE_HOME": home / ".local" / "state",
    }
    env = {name: str(path) for name, path in dirs.items()}
    env |= {"HOME": str(home), "TMPDIR": str(root), "SANDBOX_DATA_DIR": str(root / "data")}
    env |= {"PATH": f"{BIN}:/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "NO_COLOR": "1", "CI": "1"}
    return env


def installed_or_skip(client: str, probe_root: Path) -> None:
    executable = BIN / EXECUTABLE[client]
    if not executable.exists():
        pytest.skip(f"{client} is not installed at {executable}: `make agents` installs it from npm")
    probe = subprocess.run(
        [str(executable), "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=private_env(probe_root, probe_root),
    )
    if probe.returncode != 0:
        pytest.skip(f"{client} is installed but cannot run here: {(probe.stderr or probe.stdout).strip()[-500:]}")


def drive(client: str, root: Path) -> Run:
    setup, server_class = CLIENTS[client]
    workspace, home, outside = root / "ws", root / "home", root / "outside" / "out.txt"
    for directory in (workspace, home, outside.parent):
        directory.mkdir(parents=True)
    (workspace / "notes.txt").write_text(NOTES)
    server = [SANDBOX, "mcp", "--workspace", str(workspace), "--backend", "bwrap", "--mode", "auto"]
    with server_class(steps(outside)) as model:
        argv, extra = setup(root, home, server, model.url)
        done = subprocess.run(
            argv,
            cwd=workspace,
            env=private_env(root, home) | extra,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
    return Run(client, root, workspace, outside, model, done)


_RUNS: dict[str, Run] = {}


@pytest.fixture(scope="module", params=list(CLIENTS))
def run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Run:
    client = str(request.param)
    backend_or_skip("bwrap")
    if client not in _RUNS:
        installed_or_skip(client, tmp_path_factory.mktemp(f"{client}-probe"))
        _RUNS[client] = drive(client, tmp_path_factory.mktemp(client))
    return _RUNS[client]


def readable(value: Any) -> str:
    """A tool result as the client sent it, with every JSON string inside unfolded, joined by newlines."""
    found: list[str] = []

    def walk(item: Any) -> None:
        if isinstance(item, dict):
            for inner in item.values():
                walk(inner)
        elif isinstance(item, list):
            for inner in item:
                walk(inner)
        elif isinstance(item, str):
            found.append(item)
            nested = _json_in(item)
            if nested is not None:
                walk(nested)

    walk(value)
    return "\n".join(found)


def _json_in(text: str) -> Any:
    """The JSON object or array a client's text holds (Codex prefixes a wall time, Claude Code
    appends a reminder, Gemini CLI quotes the raw result inside its message), else None."""
    starts = [i for i in (text.find("{"), text.find("[")) if i >= 0]
    if not starts:
        return None
    start = min(starts)
    end = max(text.rfind("}"), text.rfind("]"))
    try:
        return json.loads(text[start : end + 1])
    except ValueError:
        return None


def _find_structured(value: Any) -> dict[str, Any] | None:
    if isinstance(value, dict):
        if "tool_call_id" in value and "ok" in value and "text" in value:
            return value
        for inner in value.values():
            found = _find_structured(inner)
            if found is not None:
                return found
    elif isinstance(value, list):
        for inner in value:
            found = _find_structured(inner)
            if found is not None:
                return found
    elif isinstance(value, str):
        return _find_structured(_json_in(value))
    return None


def test_the_run_ends_with_the_models_answer(run: Run) -> None:
    assert run.done.returncode == 0, (run.done.stdout[-3000:], run.done.stderr[-3000:])
    assert run.server.errors == [], run.server.errors
    assert models.DONE_TEXT in run.done.stdout, run.done.stdout[-3000:]


def test_the_model_is_offered_the_sandboxs_tools(run: Run) -> None:
    main = [r.body for r in run.server.requests if run.server.offered(r.body, "Bash")]
    assert main, (run.server.offered_tools(), run.done.stderr[-3000:])
    missing = [tool for tool in TOOLS if run.server.offered(main[0], tool) is None]
    assert missing == [], (missing, run.server.offered_tools())


def test_bash_output_reaches_the_model_with_its_streams_apart(run: Run) -> None:
    shown = run.shown(BASH)
    assert "out\n[stderr]\nerr" in shown, shown
    structured = run.structured(BASH)
    if structured is not None:  # a client that forwards the structured part shows the streams apart too
        assert (structured["stdout"], structured["stderr"], structured["exit_code"]) == ("out\n", "err\n", 0)


def test_reads_file_text_reaches_the_model(run: Run) -> None:
    shown = run.shown(READ)
    assert NUMBERED in shown, shown


def test_write_writes_the_workspace(run: Run) -> None:
    assert (run.workspace / "new.txt").read_text() == "written\n"
    assert "wrote 8 bytes" in run.shown(WRITE)


def test_a_path_outside_the_workspace_is_refused_with_its_reason(run: Run) -> None:
    shown = run.shown(OUTSIDE)
    assert "[TOOL_DENIED]" in shown and "outside the workspace" in shown, shown
    assert not run.outside.exists()


def test_each_part_says_the_same(run: Run) -> None:
    """Where the client forwarded ``structuredContent``, its ``text`` is the result's whole text."""
    for step in (BASH, READ, WRITE, OUTSIDE):
        structured = run.structured(step)
        if structured is not None:
            assert structured["text"].strip() in run.shown(step)
