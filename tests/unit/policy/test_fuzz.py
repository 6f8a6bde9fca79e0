"""Property-based tests (Hypothesis) of the inputs a model or a client controls.

- The Bash command policy: random and mutated shell text never raises; a command the parser
  gives up on is never exempt; an exempt command stays exempt when only whitespace or quoting
  changes.
- The path resolver: random paths of ``..``, symlinks, ``~`` and unicode never resolve outside
  the workspace while being called inside it.
- The profile loader: random TOML gives a named ``INVALID_ARGUMENT``, never a traceback.
- The JSON-RPC server: random and truncated frames give JSON-RPC errors, and it still answers.

The example counts are fixed (``EXAMPLES``) so the figures the README quotes are what CI runs.
"""

from __future__ import annotations

import json
import os
import string
from typing import TYPE_CHECKING

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sandbox import profile as profiles
from sandbox.errors import SandboxError
from sandbox.patterns import DEFAULT_DENY_READ, NameSet, PatternSet
from sandbox.policy import commands, shell
from sandbox.policy.paths import PathPolicy, within
from sandbox.policy.rules import RuleSet

if TYPE_CHECKING:
    from pathlib import Path

    from tests.unit.policy.policy_world import World

EXAMPLES = {"command": 600, "exempt": 300, "path": 500, "profile": 300, "rpc": 300, "names": 500}
FIXTURES_OK = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]

# -- the Bash command policy ------------------------------------------------------------------

SHELL_TOKENS = [
    "ls",
    "cat",
    "rm",
    "-rf",
    "/",
    "~",
    "..",
    "src",
    ".env",
    "|",
    "||",
    "&&",
    ";",
    "&",
    ">",
    ">>",
    "<",
    "2>&1",
    "$(",
    ")",
    "`",
    "'",
    '"',
    "\\",
    "{a,b}",
    "{1..3}",
    "*",
    "?",
    "[",
    "]",
    "$HOME",
    "${x:-$(id)}",
    "<<EOF",
    "EOF",
    "\n",
    " ",
    "\t",
    "#",
    "(",
    "function",
    "f()",
    "{",
    "}",
    "eval",
    "sudo",
    "git",
    "push",
    "--force",
    "curl",
    "sh",
    "-c",
    "dd",
    "of=/dev/sda",
    "mkfs.ext4",
    "chmod",
    "777",
    "find",
    "-exec",
    "xargs",
    "env",
    "python3",
    "=",
    "x=1",
    "!",
    "case",
    "esac",
    "for",
    "do",
    "done",
]
shellish = st.lists(st.sampled_from(SHELL_TOKENS), max_size=25).map(" ".join) | st.lists(
    st.sampled_from(SHELL_TOKENS), max_size=25
).map("".join)
any_text = st.text(max_size=300)


@pytest.fixture
def policy(world: World) -> tuple[PathPolicy, RuleSet]:
    return PathPolicy(world.ws, world.scratch), RuleSet()


@settings(max_examples=EXAMPLES["command"], deadline=None, suppress_health_check=FIXTURES_OK)
@given(command=shellish | any_text)
def test_command_policy_never_raises_and_never_exempts_what_it_cannot_parse(
    policy: tuple[PathPolicy, RuleSet], command: str
) -> None:
    paths, rules = policy
    verdict = commands.judge(command, paths, rules)
    assert verdict.finding.layer in ("exempt", "mode", "ask", "deny")
    try:
        shell.parse(command)
    except shell.Unparseable:
        assert verdict.finding.layer in ("ask", "deny"), (command, verdict.finding)


READ_ONLY = [
    ["ls", "src"],
    ["cat", "README.md"],
    ["grep", "-n", "main", "src/main.py"],
    ["head", "-n", "3", "README.md"],
    ["wc", "-l", "README.md"],
    ["git", "status"],
    ["git", "log", "--oneline"],
    ["find", "src", "-name", "main.py"],
    ["echo", "hello"],
    ["pwd"],
]


def _respelt(words: list[str], draw: st.DrawFn) -> str:
    spelt = []
    for word in words:
        style = draw(st.sampled_from(["plain", "single", "double", "split"]))
        if style == "single":
            spelt.append(f"'{word}'")
        elif style == "double":
            spelt.append(f'"{word}"')
        elif style == "split" and len(word) > 1:
            spelt.append(f"{word[0]}'{word[1:]}'")
        else:
            spelt.append(word)
    gaps = [draw(st.sampled_from([" ", "  ", "\t", " \t "])) for _ in spelt]
    lead = draw(st.sampled_from(["", " ", "\t"]))
    return lead + "".join(w + g for w, g in zip(spelt, gaps, strict=True))


@st.composite
def exempt_and_respelt(draw: st.DrawFn) -> tuple[str, str]:
    words = draw(st.sampled_from(READ_ONLY))
    return " ".join(words), _respelt(words, draw)


@settings(max_examples=EXAMPLES["exempt"], deadline=None, suppress_health_check=FIXTURES_OK)
@given(pair=exempt_and_respelt())
def test_an_exempt_command_stays_exempt_when_only_spelling_changes(
    policy: tuple[PathPolicy, RuleSet], pair: tuple[str, str]
) -> None:
    paths, rules = policy
    plain, respelt = pair
    assert commands.judge(plain, paths, rules).finding.layer == "exempt", plain
    assert commands.judge(respelt, paths, rules).finding.layer == "exempt", respelt


# -- the path resolver ------------------------------------------------------------------------

COMPONENTS = [
    "..",
    ".",
    "src",
    "src_link",
    "link_out",
    "notes_link.txt",
    "dangling.txt",
    "key_link",
    "README.md",
    "main.py",
    ".git",
    "hooks",
    "app2",
    "work",
    "app",
    "é",
    "ñ/..",
    "日本",
    "\u200b",
    "a b",
    "",
]


@st.composite
def path_arguments(draw: st.DrawFn) -> str:
    parts = draw(st.lists(st.sampled_from(COMPONENTS), min_size=1, max_size=8))
    start = draw(st.sampled_from(["", "/", "~/", "./"]))
    return start + "/".join(parts) or "."


@settings(max_examples=EXAMPLES["path"], deadline=None, suppress_health_check=FIXTURES_OK)
@given(raw=path_arguments())
def test_a_path_called_inside_the_roots_resolves_inside_them(world: World, raw: str) -> None:
    paths = PathPolicy(world.ws, world.scratch)
    try:
        resolved = paths.resolve(raw)
    except SandboxError:
        return  # refused with a structured error: fine
    # What the kernel would open, computed independently of the resolver.
    real = os.path.realpath(os.path.join(str(world.ws), os.path.expanduser(raw)))
    if resolved.root == "workspace":
        assert within(os.path.realpath(world.ws), real), (raw, resolved)
        assert within(os.path.realpath(world.ws), resolved.canonical)
    elif resolved.root == "scratch":
        assert within(os.path.realpath(world.scratch), real), (raw, resolved)
    else:
        assert not within(os.path.realpath(world.ws), real) or not os.path.lexists(real) or real == resolved.canonical


# -- the profile loader -----------------------------------------------------------------------

SECTIONS = ["mount", "network", "limits", "timeouts", "policy", "env", "docker", "bogus"]
KEYS = [
    "strategy",
    "mode",
    "allow",
    "memory",
    "pids",
    "cpus",
    "default_s",
    "max_s",
    "exclude",
    "deny_read",
    "set",
    "files",
    "image",
    "transparent",
    "tmp_size",
    "x",
]
scalars = (
    st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True)
    | st.text(string.printable, max_size=20)
    | st.booleans()
)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4), max_leaves=6)


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return "nan" if value != value else ("inf" if value == float("inf") else repr(value).replace("-inf", "-inf"))
    if isinstance(value, int):
        return str(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(value)


@st.composite
def toml_texts(draw: st.DrawFn) -> str:
    top = draw(st.lists(st.sampled_from(["backend", "requires", "name", "description"]), max_size=3))
    lines = [f"{key} = {_toml_value(draw(values))}" for key in top]
    for section in draw(st.lists(st.sampled_from(SECTIONS), max_size=4, unique=True)):
        keys = draw(st.lists(st.sampled_from(KEYS), max_size=4, unique=True))
        lines += [f"[{section}]", *(f"{key} = {_toml_value(draw(values))}" for key in keys)]
    text = "\n".join(lines) + "\n"
    cut = draw(st.integers(min_value=0, max_value=len(text)))
    return text if draw(st.booleans()) else text[:cut]  # truncated half the time


@settings(max_examples=EXAMPLES["profile"], deadline=None, suppress_health_check=FIXTURES_OK)
@given(text=toml_texts() | any_text)
def test_random_toml_gives_a_named_error_never_a_traceback(tmp_path: Path, text: str) -> None:
    path = tmp_path / "random.toml"
    path.write_text(text, encoding="utf-8")
    error: SandboxError | None = None
    try:
        profiles.load(str(path))
    except SandboxError as exc:
        error = exc
    assert error is None or (error.code == "INVALID_ARGUMENT" and str(path) in error.message), error


# -- the JSON-RPC server ----------------------------------------------------------------------

frames = (
    st.binary(max_size=200)
    | any_text.map(str.encode)
    | st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=10),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
        max_leaves=8,
    ).map(lambda v: json.dumps(v).encode())
    | st.fixed_dictionaries(
        {
            "jsonrpc": st.just("2.0"),
            "id": st.none() | st.integers() | st.text(max_size=5) | st.lists(st.integers(), max_size=2),
            "method": st.sampled_from(
                ["initialize", "tool.call", "session.open", "session.close", "$/cancelRequest", "nope", "audit.query"]
            )
            | st.text(max_size=10),
            "params": st.none()
            | st.lists(st.integers(), max_size=2)
            | st.text(max_size=5)
            | st.dictionaries(
                st.sampled_from(["session_id", "name", "args", "id", "workspace", "limit"]),
                st.none() | st.integers() | st.text(max_size=8) | st.lists(st.integers(), max_size=2),
                max_size=4,
            ),
        }
    ).map(lambda v: json.dumps(v).encode())
)


def _replies(fd: int) -> list[dict[str, object]]:
    data = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            break
        if not chunk:
            break
        data += chunk
    return [json.loads(line) for line in data.splitlines() if line]


@settings(max_examples=EXAMPLES["rpc"], deadline=None, suppress_health_check=FIXTURES_OK)
@given(frame=frames, cut=st.integers(min_value=0, max_value=400))
def test_random_and_truncated_frames_get_json_rpc_errors_and_the_server_survives(frame: bytes, cut: int) -> None:
    from sandbox.jsonrpc import Writer
    from sandbox.server import Server

    r, w = os.pipe()
    os.set_blocking(r, False)
    try:

        async def exchange() -> list[dict[str, object]]:
            server = Server(Writer(w))
            for line in (frame, frame[: cut % (len(frame) + 1)]):
                await server.dispatch(line)
            await server.dispatch(b'{"jsonrpc":"2.0","id":"alive","method":"initialize","params":{}}')
            await server.close_all()
            return _replies(r)

        replies = anyio.run(exchange)
    finally:
        os.close(r)
        os.close(w)
    assert replies and replies[-1]["id"] == "alive" and "result" in replies[-1], replies
    for reply in replies[:-1]:
        assert reply.get("jsonrpc") == "2.0"
        if "error" in reply:
            error = reply["error"]
            assert isinstance(error, dict) and isinstance(error.get("code"), int) and error.get("message")


# -- the sealing's name matcher ---------------------------------------------------------------

name_text = st.text(alphabet=string.ascii_letters + string.digits + "._-*?[]! ", max_size=20)


@settings(max_examples=EXAMPLES["names"], deadline=None)
@given(name=name_text | st.sampled_from([".env", ".env.local", ".env.example", "a.pem", "id_rsa", "x.key", "key"]))
def test_the_name_matcher_agrees_with_the_path_matcher(name: str) -> None:
    """seal.find judges names with NameSet's fullmatch; it must say what PatternSet's search says."""
    bare = [p for p in DEFAULT_DENY_READ if "/" not in p.lstrip("!") and not p.startswith("~")]
    assert NameSet(bare).matches(name) == PatternSet(bare, ()).matches(name)
