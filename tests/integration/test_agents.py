"""``sandbox mcp`` under the agents people use: Claude Code, Codex CLI, Gemini CLI and opencode.

Each client is the real one, installed from npm at a pinned version (``make agents``:
tests/agents/package.json), run headless against a scripted model on loopback speaking its own API
(tests/agents/models.py), with ``sandbox mcp`` as its MCP server. Each is configured and started
from the snippets of docs/guides/agent-tools.md (its server entry and its headless command line),
adding only the scripted model as its provider, JSON output and the scenario's ``sandbox mcp`` flags
after the snippet's own. The model asks for one tool call a turn, then ends; every request the client sent is
recorded, so the tests read exactly what the client showed the model after each call.

The scenarios, one run per client each: ``auto`` (Bash, Read, Write in the workspace and outside
it), ``copy`` (the Write kept as a changeset when the client ends, applied afterwards), ``ask``
(the client's answer to a confirmation reaching the model), a client stopped mid-``sleep`` (no
process left), and Claude Code on Docker.

Each client's HOME and XDG directories are a temporary directory: nothing of this machine's user
configuration is read or written. A client that is not installed, or that cannot start here, is
skipped with the reason; a run that starts and goes wrong fails.

What each forwards to the model (the reason ``structuredContent`` carries ``text``): Claude Code
sends a successful result's ``structuredContent`` as JSON and an error's text; Codex CLI sends
``structuredContent`` as JSON, error or not; Gemini CLI and opencode send ``content``'s text
(Gemini CLI quotes the raw result, both parts, for an error).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil
import pytest

from tests.agents import models
from tests.conftest import backend_or_skip, own_like_a_checkout, survivors
from tests.integration.test_mcp_readme import snippets

if TYPE_CHECKING:
    from collections.abc import Callable

pytestmark = [pytest.mark.npm, pytest.mark.slow, pytest.mark.timeout(300)]

AGENTS = Path(__file__).resolve().parents[1] / "agents"
BIN = AGENTS / "node_modules" / ".bin"
SANDBOX = str(Path(sys.executable).with_name("sandbox"))
TOOLS = ("Bash", "Read", "Write", "Edit", "Glob", "Grep", "LS")
PROMPT = "Use the sandbox's tools as the task needs."
NOTES = "alpha\nbeta\n"
NUMBERED = "     1\talpha\n     2\tbeta"


@dataclasses.dataclass(frozen=True)
class Place:
    """A run's directories: the client's HOME, the workspace (its working directory) and a file outside."""

    root: Path

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def workspace(self) -> Path:
        return self.root / "ws"

    @property
    def outside(self) -> Path:
        return self.root / "outside" / "out.txt"

    @property
    def data(self) -> Path:
        # Where every server of the run keeps its changesets, whatever environment its client passes
        # it (Codex passes only HOME, PATH and TMPDIR): $XDG_DATA_HOME/sandbox and ~/.local/share/sandbox.
        return self.home / ".local" / "share" / "sandbox"


@dataclasses.dataclass
class Run:
    """One headless run of a client through the script: what it printed, what the model was shown."""

    client: str
    place: Place
    server: models.ModelServer
    done: subprocess.CompletedProcess[str]

    @property
    def workspace(self) -> Path:
        return self.place.workspace

    def shown(self, step: int) -> str:
        """Everything the model was shown after the script's ``step``-th call, JSON unfolded."""
        results = self.server.tool_results()
        assert len(results) > step, (self.client, results, self.done.stdout[-3000:], self.done.stderr[-3000:])
        return readable(results[step])

    def structured(self, step: int) -> dict[str, Any] | None:
        """The ``structuredContent`` the model was shown after ``step``, when the client sent it."""
        return _find_structured(self.server.tool_results()[step])


@dataclasses.dataclass(frozen=True)
class Scenario:
    """What a run adds to the guide's ``sandbox mcp`` arguments, and what the model asks for."""

    flags: tuple[str, ...]
    steps: Callable[[Place], list[models.Step]]
    backend: str = "bwrap"


def everything(place: Place) -> list[models.Step]:
    return [
        models.Step("Bash", {"command": "echo out; echo err >&2"}),
        models.Step("Read", {"path": "notes.txt"}),
        models.Step("Write", {"path": "new.txt", "content": "written\n"}),
        models.Step("Write", {"path": str(place.outside), "content": "x"}),
    ]


def one_write(place: Place) -> list[models.Step]:
    del place
    return [models.Step("Write", {"path": "new.txt", "content": "written\n"})]


def bash_and_write(place: Place) -> list[models.Step]:
    return everything(place)[:1] + one_write(place)


BASH, READ, WRITE, OUTSIDE = range(4)
SCENARIOS = {
    # The workspace bound read-write, so each result shows at once in the workspace.
    "auto": Scenario(("--backend", "bwrap", "--mount", "rw"), everything),
    # Unattended without widening the boundary: the work stays in a private copy, kept at the end.
    "copy": Scenario(("--backend", "bwrap", "--mount", "copy"), one_write),
    # Every change confirmed: asked through elicitation, where the client offers it.
    "ask": Scenario(("--backend", "bwrap", "--mount", "rw", "--mode", "ask"), one_write),
    "docker": Scenario(("--backend", "docker", "--mount", "rw"), bash_and_write, backend="docker"),
}


# How each client is configured and started: from the guide's snippet for it (its server entry,
# with the scenario's flags after the snippet's own) and the guide's headless command line, plus
# only what the test needs: the scripted model as the provider, output as JSON, a private HOME.
Setup = tuple[list[str], dict[str, str]]
TASK = "Fix the failing test"  # the guide's; the scripted model plays its script whatever it is asked


def readme_json(name: str) -> dict[str, Any]:
    lang, body = snippets()[name]
    assert lang == "json", name
    loaded: dict[str, Any] = json.loads(body)
    return loaded


def headless(executable: str) -> list[str]:
    """The guide's headless command line for ``executable``, the client run from ``BIN``."""
    for line in snippets()["headless"][1].splitlines():
        words = shlex.split(line)
        if words and words[0] == executable:
            assert TASK in words, (TASK, line)
            return [str(BIN / executable), *words[1:]]
    raise AssertionError(f"the guide's headless snippet has no {executable} line")


def with_flags(entry: dict[str, Any], key: str, flags: tuple[str, ...]) -> dict[str, Any]:
    return {**entry, key: [*entry[key], *flags]}


def claude(place: Place, flags: tuple[str, ...], url: str) -> Setup:
    entry = with_flags(readme_json("claude-code")["mcpServers"]["sandbox"], "args", flags)
    (place.workspace / ".mcp.json").write_text(json.dumps({"mcpServers": {"sandbox": entry}}))
    env = {
        "ANTHROPIC_BASE_URL": url,
        "ANTHROPIC_API_KEY": "sk-scripted",
        "CLAUDE_CONFIG_DIR": str(place.home / ".claude"),
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        # Else MCP tools are deferred behind its ToolSearch tool, which the scripted model never calls.
        "ENABLE_TOOL_SEARCH": "false",
    }
    return [*headless("claude"), "--output-format", "stream-json", "--verbose"], env


def codex(place: Place, flags: tuple[str, ...], url: str) -> Setup:
    config = tomllib.loads(snippets()["codex"][1])
    entry = with_flags(config.pop("mcp_servers")["sandbox"], "args", flags)
    provider = {"name": "scripted", "base_url": f"{url}/v1", "wire_api": "responses", "env_key": "SCRIPTED_API_KEY"}
    config = {"model": "scripted", "model_provider": "scripted", **config}
    config |= {"model_providers": {"scripted": provider}, "mcp_servers": {"sandbox": entry}}
    codex_home = place.home / ".codex"
    codex_home.mkdir(parents=True)
    (codex_home / "config.toml").write_text(toml(config))
    argv = [*headless("codex"), "--skip-git-repo-check", "--json"]  # the workspace is no git checkout
    return argv, {"CODEX_HOME": str(codex_home), "SCRIPTED_API_KEY": "sk-scripted"}


def gemini(place: Place, flags: tuple[str, ...], url: str) -> Setup:
    entry = with_flags(readme_json("gemini")["mcpServers"]["sandbox"], "args", flags)
    settings = {
        "mcpServers": {"sandbox": entry},
        # GOOGLE_GEMINI_BASE_URL alone selects the "gateway" auth, which -p refuses as invalid.
        "security": {"auth": {"selectedType": "gemini-api-key"}},
        "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False},
    }
    (place.home / ".gemini").mkdir(parents=True)
    (place.home / ".gemini" / "settings.json").write_text(json.dumps(settings))
    # --skip-trust: a fresh HOME has trusted no folder yet.
    argv = [*headless("gemini"), "--skip-trust", "--output-format", "stream-json"]
    return argv, {"GOOGLE_GEMINI_BASE_URL": url, "GEMINI_API_KEY": "scripted"}


def opencode(place: Place, flags: tuple[str, ...], url: str) -> Setup:
    config = readme_json("opencode")
    config["mcp"] = {"sandbox": with_flags(config["mcp"]["sandbox"], "command", flags)}
    provider = {
        "npm": "@ai-sdk/openai-compatible",
        "name": "Scripted",
        "options": {"baseURL": f"{url}/v1", "apiKey": "sk-scripted"},
        "models": {"scripted": {"name": "Scripted", "tool_call": True}},
    }
    config |= {"provider": {"scripted": provider}, "model": "scripted/scripted", "small_model": "scripted/scripted"}
    config |= {"autoupdate": False, "share": "disabled"}
    (place.root / "opencode.json").write_text(json.dumps(config))
    env = {
        "OPENCODE_CONFIG": str(place.root / "opencode.json"),
        "OPENCODE_DISABLE_MODELS_FETCH": "1",
        "OPENCODE_DISABLE_AUTOUPDATE": "1",
        "OPENCODE_DISABLE_SHARE": "1",
        "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
        "OPENCODE_DISABLE_CLAUDE_CODE": "1",
        # At start it npm-installs its plugin package into its config dir; it runs on without it,
        # so the run never depends on a registry.
        "npm_config_registry": "http://127.0.0.1:9/",
    }
    return [*headless("opencode"), "--format", "json"], env


def toml(table: dict[str, Any], prefix: str = "") -> str:
    """``table`` as TOML: strings, numbers, booleans and lists of them, as JSON writes them, and tables."""
    lines = [f"{key} = {json.dumps(value)}" for key, value in table.items() if not isinstance(value, dict)]
    for key, value in table.items():
        if isinstance(value, dict):
            lines += ["", f"[{prefix}{key}]", toml(value, f"{prefix}{key}.")]
    return "\n".join(lines)


CLIENTS: dict[str, tuple[Callable[[Place, tuple[str, ...], str], Setup], type[models.ModelServer]]] = {
    "claude-code": (claude, models.AnthropicServer),
    "codex": (codex, models.ResponsesServer),
    "gemini-cli": (gemini, models.GeminiServer),
    "opencode": (opencode, models.ChatServer),
}
ON_BWRAP = [pytest.param(client, marks=pytest.mark.bwrap) for client in CLIENTS]
EXECUTABLE = {"claude-code": "claude", "codex": "codex", "gemini-cli": "gemini", "opencode": "opencode"}


def private_env(place: Place) -> dict[str, str]:
    """HOME, XDG and the sandbox's data dir under the run's root; npm's ``node`` and ``sandbox`` on PATH."""
    home = place.home
    dirs = {
        "XDG_CONFIG_HOME": home / ".config",
        "XDG_DATA_HOME": home / ".local" / "share",
        "XDG_CACHE_HOME": home / ".cache",
        "XDG_STATE_HOME": home / ".local" / "state",
    }
    env = {name: str(path) for name, path in dirs.items()}
    env |= {"HOME": str(home), "TMPDIR": str(place.root), "SANDBOX_DATA_DIR": str(place.data)}
    path = f"{BIN}:{Path(SANDBOX).parent}:/usr/local/bin:/usr/bin:/bin"
    env |= {"PATH": path, "LANG": "C.UTF-8", "NO_COLOR": "1", "CI": "1"}
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
        env=private_env(Place(probe_root)),
    )
    if probe.returncode != 0:
        pytest.skip(f"{client} is installed but cannot run here: {(probe.stderr or probe.stdout).strip()[-500:]}")


def prepare(client: str, root: Path, scenario: Scenario, url: str) -> tuple[Place, list[str], dict[str, str]]:
    place = Place(root)
    for directory in (place.workspace, place.home, place.outside.parent):
        directory.mkdir(parents=True)
    (place.workspace / "notes.txt").write_text(NOTES)
    argv, extra = CLIENTS[client][0](place, scenario.flags, url)
    if scenario.backend == "docker":
        own_like_a_checkout(place.workspace)
    return place, argv, private_env(place) | extra


def drive(client: str, root: Path, scenario: Scenario) -> Run:
    with CLIENTS[client][1](scenario.steps(Place(root))) as model:
        place, argv, env = prepare(client, root, scenario, model.url)
        done = subprocess.run(
            argv,
            cwd=place.workspace,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
    return Run(client, place, model, done)


_RUNS: dict[tuple[str, str], Run] = {}


def run_of(client: str, scenario: str, tmp_path_factory: pytest.TempPathFactory) -> Run:
    backend_or_skip(SCENARIOS[scenario].backend)
    if (client, scenario) not in _RUNS:
        installed_or_skip(client, tmp_path_factory.mktemp(f"{client}-probe"))
        _RUNS[client, scenario] = drive(client, tmp_path_factory.mktemp(f"{client}-{scenario}"), SCENARIOS[scenario])
    return _RUNS[client, scenario]


@pytest.fixture(scope="module", params=ON_BWRAP)
def run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Run:
    return run_of(str(request.param), "auto", tmp_path_factory)


@pytest.fixture(scope="module", params=ON_BWRAP)
def copy_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Run:
    return run_of(str(request.param), "copy", tmp_path_factory)


@pytest.fixture(scope="module", params=ON_BWRAP)
def ask_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Run:
    return run_of(str(request.param), "ask", tmp_path_factory)


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
    assert not run.place.outside.exists()


def test_each_part_says_the_same(run: Run) -> None:
    """Where the client forwarded ``structuredContent``, its ``text`` is the result's whole text."""
    for step in (BASH, READ, WRITE, OUTSIDE):
        structured = run.structured(step)
        if structured is not None:
            assert structured["text"].strip() in run.shown(step)


# -- a copy session's work is kept when the client ends, and reaches the workspace only when applied


KEPT = re.compile(r"this session's changes are kept as (ch-[\w-]+)")


def kept(run: Run) -> list[dict[str, Any]]:
    """The changesets kept for the run's workspace; the server may still be closing as its client ends."""
    deadline = time.monotonic() + 20
    while True:
        listed = sandbox_cli(run, "changes", "list", "--workspace", str(run.workspace), "--json")
        found: list[dict[str, Any]] = json.loads(listed.stdout)["changesets"]
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def sandbox_cli(run: Run, *args: str) -> subprocess.CompletedProcess[str]:
    env = private_env(run.place)
    return subprocess.run([SANDBOX, *args], env=env, capture_output=True, text=True, timeout=60, check=False)


def test_a_copy_session_ends_with_the_client_and_its_work_is_kept(copy_run: Run) -> None:
    assert copy_run.done.returncode == 0, (copy_run.done.stdout[-3000:], copy_run.done.stderr[-3000:])
    assert "wrote 8 bytes" in copy_run.shown(0)
    # The model, and through it the user, learns where the work goes and how to find it afterwards.
    assert "this session writes to a private copy" in copy_run.shown(0)
    assert f"sandbox changes list --workspace {copy_run.workspace}" in copy_run.shown(0)
    assert not (copy_run.workspace / "new.txt").exists()
    changesets = kept(copy_run)
    assert len(changesets) == 1, changesets


def test_a_kept_changeset_reaches_the_workspace_when_applied(copy_run: Run) -> None:
    (changeset,) = kept(copy_run)
    applied = sandbox_cli(copy_run, "changes", "apply", changeset["id"])
    assert applied.returncode == 0, (applied.stdout, applied.stderr)
    assert (copy_run.workspace / "new.txt").read_text() == "written\n"


# -- --mode ask: the approval path each client supports, its answer reaching the model

REFUSAL = {  # what the model reads, and who the audit says refused
    "claude-code": ("the MCP client dismissed the question itself", "client"),  # -p dismisses the form
    "codex": ("the MCP client declined the question itself", "client"),  # codex exec declines every question
    "gemini-cli": ("the MCP client did not declare the elicitation capability", "unattended"),
    "opencode": ("the MCP client did not declare the elicitation capability", "unattended"),
}


def test_under_ask_the_clients_answer_reaches_the_model(ask_run: Run) -> None:
    assert ask_run.done.returncode == 0, (ask_run.done.stdout[-3000:], ask_run.done.stderr[-3000:])
    shown = ask_run.shown(0)
    said, decided_by = REFUSAL[ask_run.client]
    assert "[TOOL_DENIED]" in shown and said in shown, shown
    assert not (ask_run.workspace / "new.txt").exists()
    assert models.DONE_TEXT in ask_run.done.stdout
    exported = sandbox_cli(ask_run, "audit", "export", "--jsonl")
    rows = [json.loads(line) for line in exported.stdout.splitlines()]
    assert [r["decided_by"] for r in rows if r["tool"] == "Write"] == [decided_by], rows


# -- the client stopped mid-call: nothing of the call survives


def servers_of(workspace: Path) -> list[int]:
    """``sandbox mcp`` processes serving ``workspace`` (each runs there: the guide gives no --workspace)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "cwd", "status"]):
        cmdline = proc.info["cmdline"] or []
        if proc.info["status"] != psutil.STATUS_ZOMBIE and "mcp" in cmdline and proc.info["cwd"] == str(workspace):
            found.append(proc.pid)
    return found


def wait_for(predicate: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


# Gemini CLI 0.61.0 relaunches itself as a child node process and does not pass a signal on to it:
# signalled alone, the first process waits for ever, and killed, it leaves the child (and so the
# server and the call) running. A terminal's Ctrl-C signals the whole foreground group, so that
# is how it is stopped here; the others are signalled alone, as `kill PID` or a supervisor does.
SIGNAL_THE_GROUP = {"gemini-cli"}


@pytest.mark.parametrize("client", ON_BWRAP)
def test_a_client_stopped_mid_call_leaves_no_process(
    client: str, marker: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    backend_or_skip("bwrap")
    installed_or_skip(client, tmp_path_factory.mktemp(f"{client}-probe"))
    root = tmp_path_factory.mktemp(f"{client}-stopped")
    scenario = Scenario(("--backend", "bwrap"), lambda _: [models.Step("Bash", {"command": f"sleep {marker}"})])
    with CLIENTS[client][1](scenario.steps(Place(root))) as model:
        place, argv, env = prepare(client, root, scenario, model.url)
        with (root / "client.log").open("w") as log:
            client_proc = subprocess.Popen(
                argv,
                cwd=place.workspace,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        try:
            assert wait_for(lambda: bool(survivors(marker)), 120), (model.errors, model.offered_tools())
            assert servers_of(place.workspace)
            if client in SIGNAL_THE_GROUP:
                os.killpg(client_proc.pid, signal.SIGTERM)
            else:
                client_proc.send_signal(signal.SIGTERM)
            client_proc.wait(timeout=60)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(client_proc.pid, signal.SIGKILL)  # whatever is left of the client, the test's own
            client_proc.wait()

    def alive() -> list[int]:
        return survivors(marker) + servers_of(place.workspace)

    assert wait_for(lambda: not alive(), 30), (alive(), (root / "client.log").read_text()[-3000:])


# -- Claude Code on Docker


@pytest.mark.docker
def test_claude_code_on_docker(tmp_path_factory: pytest.TempPathFactory) -> None:
    done = run_of("claude-code", "docker", tmp_path_factory)
    assert done.done.returncode == 0, (done.done.stdout[-3000:], done.done.stderr[-3000:])
    assert "out\n[stderr]\nerr" in done.shown(0)
    structured = done.structured(0)
    assert structured is not None and (structured["stdout"], structured["stderr"]) == ("out\n", "err\n")
    assert "wrote 8 bytes" in done.shown(1)
    assert (done.workspace / "new.txt").read_text() == "written\n"
