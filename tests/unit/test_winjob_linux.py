"""The winjob backend seen from Linux: it imports, says why it is unavailable, and ``auto`` never picks it."""

from __future__ import annotations

import sys

import pytest

from sandbox.backends import AUTO_ORDER, BACKENDS, base, winjob_command, winjob_process, winjob_view
from sandbox.errors import BackendUnavailable

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="the Linux view; tests/wine covers Windows")


def test_listed_but_never_chosen_by_auto_here() -> None:
    assert "winjob" in BACKENDS and "winjob" not in AUTO_ORDER


def test_unavailable_with_the_reason() -> None:
    report = base.get("winjob").probe()
    assert not report.available and "Windows" in report.reason and sys.platform in report.reason
    assert not any(report.guarantees.values())  # nothing claimed where nothing runs


def test_a_named_winjob_is_refused_not_weakened() -> None:
    from sandbox import profile as profiles

    with pytest.raises(BackendUnavailable, match="winjob is unavailable"):
        base.choose("winjob", profiles.load("trusted"))


def test_crash_codes_are_named() -> None:
    assert winjob_process.ntstatus_name(0xC0000005) == "0xC0000005 STATUS_ACCESS_VIOLATION"
    assert winjob_process.ntstatus_name(0xC0001234) == "0xC0001234"
    assert winjob_process.ntstatus_name(3) is None


def test_command_lines_quote_as_windows_parses_them() -> None:
    assert winjob_command.command_line(["a b", "c"]) == '"a b" c'
    assert winjob_command.command_line(winjob_command.shell_argv('echo "x" & exit 2', comspec="cmd.exe")) == (
        'cmd.exe /d /s /c "echo "x" & exit 2"'
    )
    assert winjob_command.shell_argv("Get-Date", "powershell")[0] == "powershell.exe"


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("notes.txt.", "trailing dot"),
        ("notes.txt ", "trailing dot or space"),
        ("CON", "reserved device name (CON)"),
        ("nul.tar.gz", "reserved device name (NUL)"),
        ("Com1.log", "reserved device name (COM1)"),
        ("lpt\u00b9", "reserved device name"),
        ("CONOUT$", "reserved device name"),
        ("a.txt:stream", "alternate data stream"),
        ("a.txt::$DATA", "alternate data stream"),
        ("C:", "a drive"),
        ("..\\up", "path separator"),
        ("what?", "forbids"),
        ("tab\there", "forbids"),
    ],
)
def test_windows_names_that_mean_another_file_are_refused(name: str, why: str) -> None:
    from sandbox.errors import Conflict
    from sandbox.mounts import winpaths as winjob_paths

    problem = winjob_paths.windows_name_problem(name)
    assert problem is not None and why in problem, problem
    with pytest.raises(Conflict, match="not applied on Windows"):
        winjob_paths.checked_parts(f"sub/{name}", "windows")
    assert winjob_paths.checked_parts(f"sub/{name}", "posix") == ("sub", name)  # a legal POSIX name


@pytest.mark.parametrize("name", ["console.txt", "nully", "COM10", "a.b.c", ".gitignore", "con-fig", "réadmé"])
def test_ordinary_windows_names_pass(name: str) -> None:
    from sandbox.mounts import winpaths as winjob_paths

    assert winjob_paths.windows_name_problem(name) is None
    assert winjob_paths.checked_parts(f"d/{name}", "windows") == ("d", name)


@pytest.mark.parametrize("path", ["", "/etc/passwd", "a/../../b", "./a", "a//b", ".."])
def test_paths_leaving_the_workspace_are_refused_in_both_flavours(path: str) -> None:
    from sandbox.errors import Conflict
    from sandbox.mounts import winpaths as winjob_paths

    for flavour in ("posix", "windows"):
        with pytest.raises(Conflict):
            winjob_paths.checked_parts(path, flavour)


def test_case_collisions_name_every_path_of_a_group() -> None:
    from sandbox.mounts import winpaths as winjob_paths

    found = winjob_paths.case_collisions(["README.md", "readme.md", "src/A.py", "src/b.py", "SRC/a.PY"])
    assert found == {"README.md", "readme.md", "src/A.py", "SRC/a.PY"}


def test_the_copy_view_moves_paths_under_the_workspace_only() -> None:
    from pathlib import PureWindowsPath

    view = winjob_view.View(PureWindowsPath("C:\\Work\\proj"), PureWindowsPath("C:\\Data\\copy-1"))  # type: ignore[arg-type]
    assert view.into("c:\\work\\PROJ\\src\\a.py") == "C:\\Data\\copy-1\\src\\a.py"
    assert view.into("C:\\Work\\project2\\x") == "C:\\Work\\project2\\x"  # a sibling, not inside
    assert view.out("C:\\Data\\copy-1") == "C:\\Work\\proj"
    request, op = view.request(b'{"op": "write", "path": "C:\\\\Work\\\\proj\\\\n.txt", "content": "x"}')
    assert op == "write" and b"copy-1" in request
    reply = view.reply(
        b'{"ok": true, "content": "wrote 1 byte to C:\\\\Data\\\\copy-1\\\\n.txt", '
        b'"details": {"paths": ["C:\\\\Data\\\\copy-1\\\\n.txt"]}, "resolved": "C:\\\\Data\\\\copy-1\\\\n.txt"}',
        "write",
    )
    assert b"copy-1" not in reply and reply.count(b"proj") == 3
    read = view.reply(b'{"ok": true, "content": "C:\\\\Data\\\\copy-1 in a file", "resolved": "x"}', "read")
    assert b"copy-1 in a file" in read  # a Read's content is the file's own
