"""ADR 0057's search contract through a real jail: Glob ``limit``; Grep's ``outputMode``,
``headLimit`` and ``caseInsensitive`` (and the names they replaced); Read of a directory.

The argument checks need no jail and run first; the rest run per backend.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from sandbox import profile as profiles
from sandbox.errors import InvalidArgument
from sandbox.session import Sandbox
from sandbox.tools.params import GlobParams, GrepParams, validate

if TYPE_CHECKING:
    from pathlib import Path

    from sandbox.backends import base


# -- the arguments ---------------------------------------------------------------------------------


def test_schema_exposes_exactly_the_adr_names() -> None:
    grep = GrepParams.model_json_schema()["properties"]
    assert grep["outputMode"]["enum"] == ["content", "filesWithMatches", "count"]
    assert {"headLimit", "caseInsensitive"} <= set(grep) and not {"limit", "ignore_case"} & set(grep)
    assert GlobParams.model_json_schema()["properties"]["limit"]["maximum"] == 1000


@pytest.mark.parametrize("spelling", ["filesWithMatches", "files_with_matches", "files-with-matches"])
def test_shell_style_output_modes_are_normalised(spelling: str) -> None:
    params = validate("Grep", {"pattern": "x", "outputMode": spelling})
    assert isinstance(params, GrepParams) and params.outputMode == "filesWithMatches"


@pytest.mark.parametrize("mode", ["files", "FILES_WITH_MATCHES", "lines", ""])
def test_other_output_modes_are_refused(mode: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        validate("Grep", {"pattern": "x", "outputMode": mode})
    assert caught.value.data["problems"][0]["field"] == "outputMode"


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ({"limit": 7, "ignore_case": True}, (7, True, "content")),  # what the pi extension sends today
        ({"headLimit": 7, "caseInsensitive": True}, (7, True, "content")),
        ({"head_limit": 7, "case_insensitive": True, "output_mode": "count"}, (7, True, "count")),
        ({}, (100, False, "content")),
    ],
)
def test_old_and_snake_case_names_are_aliases(args: dict[str, Any], expected: tuple[int, bool, str]) -> None:
    params = validate("Grep", {"pattern": "x", **args})
    assert isinstance(params, GrepParams)
    assert (params.headLimit, params.caseInsensitive, params.outputMode) == expected
    assert validate("Grep", params.model_dump()) == params  # a dump (the audit's) reads back


@pytest.mark.parametrize(
    "args",
    [{"limit": 5, "headLimit": 5}, {"ignore_case": True, "caseInsensitive": False}, {"limit": 1, "head_limit": 2}],
)
def test_one_argument_under_two_names_is_refused(args: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgument, match="give it once"):
        validate("Grep", {"pattern": "x", **args})


@pytest.mark.parametrize("limit", [0, 1001])
def test_glob_limit_is_bounded(limit: int) -> None:
    with pytest.raises(InvalidArgument):
        validate("Glob", {"pattern": "*", "limit": limit})


# -- through the jail -------------------------------------------------------------------------------


@pytest.fixture
async def session(backend: base.Backend, workspace: Path) -> Any:
    profile = profiles.load("default").with_overrides(backend=backend.name)
    async with Sandbox.open(workspace, profile=profile, mode="auto") as s:
        yield s


@pytest.fixture
def tree(workspace: Path) -> Path:
    """Three files with NEEDLE lines (1, 2 and 3 of them), one without, one the policy hides."""
    (workspace / "src" / "a.py").write_text("needle = 1\n")
    (workspace / "src" / "b.py").write_text("x = 0\nNEEDLE = 2\nneedle()\n")
    (workspace / "src" / "c.txt").write_text("needle\nneedle\nNeedle\n")
    (workspace / ".env").write_text("TOKEN=needle\n")  # deny-read by default
    return workspace


@pytest.mark.anyio
async def test_files_with_matches_lists_each_file_once(session: Sandbox, tree: Path) -> None:
    result = await session.call("Grep", {"pattern": "needle", "outputMode": "files_with_matches"})
    assert result.ok and result.details["mode"] == "filesWithMatches", result
    expected = [str(tree / "src" / name) for name in ("a.py", "b.py", "c.txt")]
    assert result.content.splitlines() == expected and result.details["files"] == expected
    assert result.details["truncated"] is False


@pytest.mark.anyio
async def test_files_with_matches_head_limit_truncates(session: Sandbox, tree: Path) -> None:
    args = {"pattern": "needle", "path": "src", "outputMode": "filesWithMatches", "headLimit": 2}
    result = await session.call("Grep", args)
    assert result.ok and result.details["truncated"] is True, result
    assert result.details["files"] == [str(tree / "src" / "a.py"), str(tree / "src" / "b.py")]
    assert "raise headLimit" in result.content.splitlines()[-1]


@pytest.mark.anyio
async def test_count_counts_matching_lines_per_file(session: Sandbox, tree: Path) -> None:
    result = await session.call("Grep", {"pattern": "needle", "outputMode": "count", "caseInsensitive": True})
    assert result.ok and result.details["mode"] == "count", result
    src = tree / "src"
    assert result.details["counts"] == [[str(src / "a.py"), 1], [str(src / "b.py"), 2], [str(src / "c.txt"), 3]]
    assert result.details["matches"] == 6
    assert result.content.splitlines() == [
        f"{src / 'a.py'}:1",
        f"{src / 'b.py'}:2",
        f"{src / 'c.txt'}:3",
        "[6 matching lines in 3 files]",
    ]


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["content", "filesWithMatches", "count"])
async def test_every_mode_hides_what_read_would_refuse(session: Sandbox, tree: Path, mode: str) -> None:
    result = await session.call("Grep", {"pattern": "TOKEN", "outputMode": mode})
    assert result.ok and ".env" not in result.content and ".env" not in str(result.details), result
    assert result.content.startswith("no ")
    assert (tree / ".env").read_text() == "TOKEN=needle\n"


@pytest.mark.anyio
async def test_case_insensitive_widens_the_match(session: Sandbox, tree: Path) -> None:
    args = {"pattern": "^NEEDLE", "path": "src/b.py"}
    exact = await session.call("Grep", args)
    folded = await session.call("Grep", {**args, "caseInsensitive": True})
    assert [hit[1] for hit in exact.details["hits"]] == [2]
    assert [hit[1] for hit in folded.details["hits"]] == [2, 3]
    assert str(tree / "src" / "b.py") in folded.content


@pytest.mark.anyio
async def test_content_head_limit_counts_matching_lines(session: Sandbox, tree: Path) -> None:
    result = await session.call("Grep", {"pattern": "needle", "path": "src/c.txt", "headLimit": 1, "context": 1})
    assert result.ok and result.details["truncated"] is True and result.details["matches"] == 1, result
    c = str(tree / "src" / "c.txt")
    assert result.details["hits"] == [[c, 1, True, "needle"]]  # the next line is a match, not context


@pytest.mark.anyio
async def test_the_pi_extensions_arguments_still_work(session: Sandbox, tree: Path) -> None:
    args = {"pattern": "needle", "path": "src", "include": "*.py", "context": 0, "limit": 1, "ignore_case": True}
    result = await session.call("Grep", args)
    assert result.ok and result.details["mode"] == "content", result
    assert result.details["hits"] == [[str(tree / "src" / "a.py"), 1, True, "needle = 1"]]
    assert result.details["truncated"] is True


@pytest.mark.anyio
async def test_glob_limit_caps_the_listing_not_the_count(session: Sandbox, tree: Path) -> None:
    result = await session.call("Glob", {"pattern": "src/*", "limit": 2})
    assert result.ok and result.details["paths"] == [str(tree / "src" / n) for n in ("a.py", "app.py")], result
    assert (result.details["count"], result.details["truncated"]) == (4, True)
    whole = await session.call("Glob", {"pattern": "src/*"})
    assert (len(whole.details["paths"]), whole.details["truncated"]) == (4, False)


@pytest.mark.anyio
@pytest.mark.parametrize("spelling", ["src", "src/", "./src"])
async def test_reading_a_directory_suggests_the_glob_that_lists_it(
    session: Sandbox, workspace: Path, spelling: str
) -> None:
    result = await session.call("Read", {"path": spelling})
    assert (result.ok, result.error_code) == (False, "INVALID_ARGUMENT"), result
    suggestion = result.details["suggestion"]
    assert suggestion == {"tool": "Glob", "args": {"pattern": "*", "path": spelling}}
    assert "is a directory" in result.content and "Glob" in result.content
    listed = await session.call(suggestion["tool"], suggestion["args"])  # the suggestion works as given
    assert listed.ok and listed.content.splitlines() == [str(workspace / "src" / "app.py")], listed
