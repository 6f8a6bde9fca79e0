"""``sandbox run``'s quick path (sandbox.cli.launch): it keeps the full path's promises or is not taken.

The contract tests of test_cli_run.py run on both paths (``run_path``, ``cli_backend``); these
are the quick path's own: what invalidates its cache, that limits still hold on it, and that
it hands the jail no host file it could reopen through ``/proc/self/fd``.
"""

from __future__ import annotations

import os
import subprocess
from typing import TYPE_CHECKING, Any

import pytest

from tests.conftest import backend_or_skip
from tests.integration._cli import sandbox, shell

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.bwrap


@pytest.fixture(autouse=True)
def _need_bwrap() -> None:
    backend_or_skip("bwrap")


def run(*args: str, **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
    return sandbox("run", *args, **kwargs)


def cache_stamp(data_dir: Path) -> list[int]:
    return [p.stat().st_mtime_ns for p in sorted((data_dir / "cache" / "profiles").glob("*.json"))]


def test_an_edited_profile_is_read_again(workspace: Path, tmp_path: Path, data_dir: Path) -> None:
    profile = tmp_path / "mine.toml"
    profile.write_text('[env]\nset = { GREETING = "one" }\n')
    common = ("--profile", str(profile), "--workspace", str(workspace), "--", "sh", "-c", "echo $GREETING")
    assert run(*common).stdout == b"one\n"
    stamp = cache_stamp(data_dir)
    assert run(*common).stdout == b"one\n"
    assert cache_stamp(data_dir) == stamp  # the quick path: nothing validated again
    profile.write_text('[env]\nset = { GREETING = "two" }\n')
    assert run(*common).stdout == b"two\n"
    profile.write_text('[limits]\nmemory = "1KiB"\n')
    refused = run(*common)
    assert refused.returncode == 125 and b"limits.memory" in refused.stderr


def test_limits_hold_on_the_quick_path(workspace: Path, tmp_path: Path, data_dir: Path) -> None:
    profile = tmp_path / "small.toml"
    profile.write_text('[limits]\nfile_size = "1MiB"\nmemory = "64MiB"\n')
    common = ("--profile", str(profile), "--workspace", str(workspace), "--")
    assert run(*common, "true").returncode == 0
    stamp = cache_stamp(data_dir)
    big_file = run(*common, "sh", "-c", "head -c 2097152 /dev/zero > big; echo $? >&2")
    assert (workspace / "big").stat().st_size <= 2**20
    assert big_file.stderr.strip() != b"0"
    hog = run(*common, "python3", "-c", "b = bytearray(256 * 2**20); print('allocated')")
    assert hog.returncode != 0 and b"allocated" not in hog.stdout
    assert cache_stamp(data_dir) == stamp


def test_a_host_file_on_stdout_is_never_handed_to_the_jail(workspace: Path, tmp_path: Path) -> None:
    """A file our stdout points at could be reopened for reading through /proc/self/fd: it is copied."""
    assert run("--workspace", str(workspace), "--", "true").returncode == 0  # warm the quick path
    target = tmp_path / "out.log"
    target.write_bytes(b"host secret\n")
    with target.open("ab") as out:
        done = run(
            "--timeout",
            "5",
            *shell(workspace, "timeout 2 cat /proc/self/fd/1 >&2; echo appended"),
            capture_output=False,
            stdout=out,
            stderr=subprocess.PIPE,
        )
    assert b"host secret" not in done.stderr
    assert target.read_bytes() == b"host secret\nappended\n"


def test_closed_stdin_reads_as_empty(workspace: Path) -> None:
    assert run("--workspace", str(workspace), "--", "true").returncode == 0
    read, write = os.pipe()
    os.close(write)
    try:
        done = run("--workspace", str(workspace), "--", "wc", "-c", stdin=read)
    finally:
        os.close(read)
    assert (done.returncode, done.stdout.strip()) == (0, b"0")
