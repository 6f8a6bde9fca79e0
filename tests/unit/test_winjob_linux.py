"""The winjob backend seen from Linux: it imports, says why it is unavailable, and ``auto`` never picks it."""

from __future__ import annotations

import sys

import pytest

from sandbox.backends import AUTO_ORDER, BACKENDS, base, winjob
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
    assert winjob.ntstatus_name(0xC0000005) == "0xC0000005 STATUS_ACCESS_VIOLATION"
    assert winjob.ntstatus_name(0xC0001234) == "0xC0001234"
    assert winjob.ntstatus_name(3) is None


def test_command_lines_quote_as_windows_parses_them() -> None:
    assert winjob.command_line(["a b", "c"]) == '"a b" c'
    assert winjob.command_line(winjob.shell_argv('echo "x" & exit 2', comspec="cmd.exe")) == (
        'cmd.exe /d /s /c "echo "x" & exit 2"'
    )
    assert winjob.shell_argv("Get-Date", "powershell")[0] == "powershell.exe"
