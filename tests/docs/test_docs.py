"""The documentation holds to what it claims: README.md and the mkdocs site in docs/.

- The README stays a front door (under 300 lines) whose relative links resolve.
- The site builds with ``mkdocs build --strict``: a broken link or anchor, a page missing from the
  navigation, or a generated reference part that cannot be rendered fails.
- Every fenced block that claims to run says how (a marker on the line before its fence), and the
  ones marked to run here are run; every TOML block parses, and a profile fragment validates
  against the profile model.

The convention (also in docs/contributing.md). A block claims to run when its info string is
``console`` (a transcript) or ``python``, and carries one of these markers:

- ``<!-- runs -->``: run on bubblewrap; ``<!-- runs: root, docker -->`` (either or both):
  run where that holds, else skipped naming what is missing;
- ``<!-- mcp-snippet: NAME -->``: an MCP client's configuration, run by test_mcp_readme.py;
- ``<!-- not run: REASON -->``: shown only.

A ``console`` block's ``$ `` lines are commands, run one after another in one bash shell in a fresh
workspace (``README.md``, ``src/app.py``) with a fresh data directory, the venv's ``sandbox`` first on
PATH and stdin from /dev/null; a trailing ``# exit N`` is the expected status (else 0). The lines up
to the next command are its expected output, stdout and stderr in any interleaving: ``...`` or ``…``
in a line matches any text, a line of only ``...`` any number of lines, blank lines are ignored,
and a command shown without output is not checked for it. A ``python`` block runs as a script in
such a workspace and must exit 0 (its claims are asserts). ``/path/to/project`` in a block names a
sample project: ``app.py`` with ``x = 1``, a passing test and a ``.venv`` holding pytest.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import tomllib
import unicodedata
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from sandbox.profile import Profile
from tests.conftest import backend_or_skip
from tests.readme_example import make_project

if TYPE_CHECKING:
    from collections.abc import Iterator

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
BIN = Path(sys.executable).parent
PLACEHOLDER = "/path/to/project"
README_MAX_LINES = 300
BLOCK_TIMEOUT_S = 540

FENCE = re.compile(r"^(?P<indent> *)```(?P<info>[^`\n]*)\n(?P<body>.*?)^(?P=indent)``` *$", re.MULTILINE | re.DOTALL)
MARKER = re.compile(r"^ *<!-- (?P<kind>runs|not run|mcp-snippet|not a profile)(?:: *(?P<arg>.*?))? *-->$")
CLAIMS_TO_RUN = frozenset({"console", "python"})
REQUIREMENTS = frozenset({"root", "docker"})
EXIT = re.compile(r"\s#\s*exit (\d+)\s*$")
WILD = re.compile(r"\.\.\.|…")
MARK = "\x1e"  # ends each command's output in both streams of a console block's run
LINK = re.compile(r"(?<!!)\[[^\]]*\]\((?P<target>[^)\s]+)\)")


@dataclasses.dataclass(frozen=True)
class Block:
    """One fenced block of a page: where it is, its language, its body and the marker before it."""

    page: Path
    line: int
    lang: str
    body: str
    marker: str | None
    marker_arg: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def requirements(self) -> set[str]:
        return {r.strip() for r in self.marker_arg.split(",") if r.strip()} if self.marker == "runs" else set()


def pages() -> list[Path]:
    return [README, *sorted(p for p in DOCS.rglob("*.md") if "hooks" not in p.relative_to(DOCS).parts)]


def blocks_of(page: Path) -> Iterator[Block]:
    text = page.read_text(encoding="utf-8")
    for match in FENCE.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = MARKER.match(before)
        indent = len(match["indent"])
        body = "\n".join(row[indent:] for row in match["body"].split("\n"))
        lang = match["info"].strip().split(" ")[0]
        kind, arg = (marker["kind"], marker["arg"] or "") if marker else (None, "")
        yield Block(page, line, lang, body, kind, arg)


def all_blocks() -> list[Block]:
    return [block for page in pages() for block in blocks_of(page)]


def runnable() -> list[pytest.ParameterSet]:
    params = []
    for block in all_blocks():
        if block.marker != "runs":
            continue
        marks = [pytest.mark.bwrap, *(getattr(pytest.mark, r) for r in block.requirements & {"root", "docker"})]
        params.append(pytest.param(block, id=block.where, marks=marks))
    return params


def profile_fragments() -> list[pytest.ParameterSet]:
    return [
        pytest.param(b, id=b.where)
        for b in all_blocks()
        if b.lang == "toml" and b.marker not in {"mcp-snippet", "not a profile"}
    ]


# The README, and the site as a whole.


def test_the_readme_is_a_front_door() -> None:
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines < README_MAX_LINES, f"README.md has {lines} lines; the rest belongs in docs/"


def test_the_readme_links_resolve() -> None:
    text = README.read_text(encoding="utf-8")
    for match in LINK.finditer(text):
        target = match["target"]
        if "://" in target or target.startswith("#"):
            continue
        path, _, anchor = target.partition("#")
        assert (ROOT / path).exists(), f"README.md links to {target}, which does not exist"
        if anchor:
            assert anchor in anchors_of(ROOT / path), f"README.md links to {target}: no such heading there"


def anchors_of(page: Path) -> set[str]:
    """The ids mkdocs gives ``page``'s headings (explicit ``{ #id }`` ones included)."""

    found = set()
    prose = FENCE.sub("", page.read_text(encoding="utf-8"))  # a shell comment is no heading
    for heading in re.findall(r"^#{1,6} +(.+?) *$", prose, re.MULTILINE):
        explicit = re.search(r"\{ *#([\w-]+) *\}$", heading)
        found.add(explicit[1] if explicit else slugify(heading))
    return found


def slugify(heading: str) -> str:
    """The id Python-Markdown's toc gives a heading (its ``slugify``, markup dropped)."""
    text = unicodedata.normalize("NFKD", heading.replace("`", "")).encode("ascii", "ignore").decode()
    return re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", text).strip().lower())


def test_the_site_builds_with_strict(tmp_path: Path) -> None:
    mkdocs = BIN / "mkdocs"
    if not mkdocs.exists():
        pytest.skip(f"mkdocs is not installed beside {sys.executable}: pip install 'sandbox[docs]'")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [str(mkdocs), "build", "--strict", "-f", str(ROOT / "mkdocs.yml"), "-d", str(tmp_path / "site")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert (tmp_path / "site" / "profiles" / "index.html").is_file()


# The blocks: each says whether it runs.


def test_every_block_that_claims_to_run_says_how() -> None:
    unmarked = [b.where for b in all_blocks() if b.lang in CLAIMS_TO_RUN and b.marker is None]
    assert not unmarked, f"console/python blocks without a runs / not run marker: {unmarked}"


def test_markers_name_what_they_need() -> None:
    for block in all_blocks():
        if block.marker == "runs":
            assert block.lang in CLAIMS_TO_RUN, f"{block.where}: only console and python blocks run"
            assert block.requirements <= REQUIREMENTS, f"{block.where}: unknown {block.requirements - REQUIREMENTS}"
        if block.marker == "not run":
            assert block.marker_arg, f"{block.where}: say why it is not run"


def test_blocks_are_found() -> None:
    assert len(runnable()) >= 20, "the pages' runnable blocks went missing (a changed fence or marker?)"


@pytest.mark.parametrize("block", profile_fragments())
def test_a_profile_snippet_is_a_valid_profile(block: Block) -> None:
    Profile.model_validate(tomllib.loads(block.body))


# Running them.


@pytest.mark.parametrize("block", runnable())
@pytest.mark.timeout(BLOCK_TIMEOUT_S + 60)
def test_the_block_runs(block: Block, tmp_path: Path) -> None:
    backend_or_skip("bwrap")
    require(block.requirements)
    workspace = sample_workspace(tmp_path / "ws")
    body = block.body
    if PLACEHOLDER in body:
        body = body.replace(PLACEHOLDER, str(make_project(tmp_path)))
    if block.lang == "python":
        run_python(block, body, workspace, tmp_path)
    else:
        run_console(block, body, workspace)


def require(needs: set[str]) -> None:
    if "root" in needs and os.geteuid() != 0:
        pytest.skip("needs root (a per-call memory cgroup); this run is as an ordinary user")
    if "docker" in needs:
        backend_or_skip("docker")


def sample_workspace(path: Path) -> Path:
    (path / "src").mkdir(parents=True)
    (path / "README.md").write_text("# sample\n")
    (path / "src" / "app.py").write_text("print('hello')\n")
    return path


def block_env() -> dict[str, str]:
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "PYTHONDONTWRITEBYTECODE": "1"}


def run_python(block: Block, body: str, workspace: Path, tmp_path: Path) -> None:
    script = tmp_path / "block.py"
    script.write_text(body)
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=workspace,
        env=block_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=BLOCK_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, (
        f"{block.where} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )


# Console transcripts.


@dataclasses.dataclass
class Command:
    text: str
    status: int
    output: list[str]


def commands_of(body: str) -> list[Command]:
    found: list[Command] = []
    lines = iter(body.split("\n"))
    for line in lines:
        if line.startswith("$ "):
            text = line[2:]
            while text.endswith("\\"):
                text += "\n" + next(lines)
            status = EXIT.search(text)
            found.append(Command(text, int(status[1]) if status else 0, []))
        elif found:
            found[-1].output.append(line)
        else:
            raise AssertionError(f"a console block starts with output, not a `$ ` command: {line!r}")
    return found


def run_console(block: Block, body: str, workspace: Path) -> None:
    commands = commands_of(body)
    script = "".join(f"{{ {c.text}\n}}\nprintf '\\n{MARK}%d\\n' \"$?\"; printf '\\n{MARK}\\n' >&2\n" for c in commands)
    done = subprocess.run(
        ["bash", "-c", script],
        cwd=workspace,
        env=block_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=BLOCK_TIMEOUT_S,
        check=False,
    )
    stdout, stderr = (part.decode("utf-8", "replace").split(f"\n{MARK}") for part in (done.stdout, done.stderr))
    ran = len(stdout) - 1  # a shell that exited early ran fewer
    assert ran == len(commands), f"{block.where}: the shell ended after {ran} of {len(commands)} commands"
    for n, command in enumerate(commands):
        out, err = stdout[n], stderr[n]
        if n:  # each part but the first starts with the previous command's status line
            out, err = out.split("\n", 1)[1] if "\n" in out else "", err.lstrip("\n")
        status = int(stdout[n + 1].split("\n", 1)[0])
        shown = f"{block.where}: $ {command.text}\n--- stdout\n{out[-3000:]}\n--- stderr\n{err[-3000:]}"
        assert status == command.status, f"exit {status}, expected {command.status}\n{shown}"
        if any(line.strip() for line in command.output):
            assert interleaves(command.output, lines(out), lines(err)), f"the output differs from the page\n{shown}"


def lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.split("\n") if line.strip()]


def interleaves(expected: list[str], out: list[str], err: list[str]) -> bool:
    """Whether ``expected`` (with its wildcards) matches some interleaving of ``out`` and ``err``.

    The states are how far each stream has been consumed; a wildcard line consumes any number of
    lines of either, a pattern line the next line of one of them."""
    states = {(0, 0)}
    for shown in (line.rstrip() for line in expected if line.strip()):
        if WILD.fullmatch(shown):
            states = {(i, j) for i in range(len(out) + 1) for j in range(len(err) + 1) if reached(states, i, j)}
            continue
        pattern = re.compile("".join(".*" if WILD.fullmatch(p) else re.escape(p) for p in _parts(shown)))
        states = {(i + 1, j) for i, j in states if i < len(out) and pattern.fullmatch(out[i])} | {
            (i, j + 1) for i, j in states if j < len(err) and pattern.fullmatch(err[j])
        }
        if not states:
            return False
    return (len(out), len(err)) in states


def reached(states: set[tuple[int, int]], i: int, j: int) -> bool:
    return any(a <= i and b <= j for a, b in states)


def _parts(shown: str) -> list[str]:
    """``shown`` split into its text and its wildcards, in order."""
    return [p for p in re.split(r"(\.\.\.|…)", shown) if p]


def test_interleaving_matches_either_order_and_wildcards() -> None:
    assert interleaves(["out", "err"], ["out"], ["err"]) and interleaves(["err", "out"], ["out"], ["err"])
    assert interleaves(["a ... c", "..."], ["a b c", "x", "y"], ["z"])
    assert not interleaves(["a"], ["a", "b"], [])
    assert not interleaves(["b", "a"], ["a", "b"], [])


def test_a_console_block_is_split_into_commands() -> None:
    found = commands_of("$ echo a \\\n  b   # exit 3\nout\n...\n$ true")
    assert [(c.status, c.output) for c in found] == [(3, ["out", "..."]), (0, [])]
