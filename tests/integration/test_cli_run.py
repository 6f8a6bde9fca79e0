"""The ``sandbox run`` contract, through the installed console script (real bubblewrap)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import backend_or_skip

pytestmark = pytest.mark.bwrap
SANDBOX = str(Path(sys.executable).with_name("sandbox"))


@pytest.fixture(autouse=True)
def _need_bwrap() -> None:
    backend_or_skip("bwrap")


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SANDBOX, "run", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=120, env=os.environ.copy(), check=False)


def test_streams_go_to_ours_and_exit_code_is_the_commands(workspace: Path) -> None:
    done = run("--", "sh", "-c", "echo out; echo err >&2; exit 7", cwd=workspace)
    assert (done.returncode, done.stdout, done.stderr) == (7, "out\n", "err\n")


def test_json_contract(workspace: Path) -> None:
    done = run("--json", "--workspace", str(workspace), "--", "sh", "-c", "echo hi; echo oops >&2")
    assert done.returncode == 0
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1
    out = json.loads(lines[0])
    for key in ("exit_code", "signal", "timed_out", "aborted", "stdout", "stderr", "stdout_bytes",
                "stderr_bytes", "stdout_truncated", "stderr_truncated", "duration_ms", "backend",
                "profile", "mount", "changes"):
        assert key in out, key
    assert (out["stdout"], out["stderr"], out["backend"], out["mount"]) == ("hi\n", "oops\n", "bwrap", "rw")


def test_timeout_exits_124(workspace: Path) -> None:
    done = run("--timeout", "1", "--workspace", str(workspace), "--", "sleep", "30")
    assert done.returncode == 124
    assert "timed out" in done.stderr


def test_signal_exits_128_plus_n(workspace: Path) -> None:
    done = run("--workspace", str(workspace), "--", "sh", "-c", "kill -TERM $$")
    assert done.returncode == 143


def test_copy_mount_without_apply_leaves_host_unchanged(workspace: Path) -> None:
    done = run("--mount", "copy", "--json", "--workspace", str(workspace), "--",
               "sh", "-c", "echo x > added.txt; rm README.md")
    out = json.loads(done.stdout)
    assert {(c["path"], c["status"]) for c in out["changes"]} == {("added.txt", "added"), ("README.md", "deleted")}
    assert (workspace / "README.md").exists() and not (workspace / "added.txt").exists()


def test_copy_mount_with_apply_changes_host(workspace: Path) -> None:
    done = run("--mount", "copy", "--apply", "--workspace", str(workspace), "--",
               "sh", "-c", "echo x > added.txt; rm README.md")
    assert done.returncode == 0, done.stderr
    assert not (workspace / "README.md").exists() and (workspace / "added.txt").read_text() == "x\n"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--backend", "nope"], "unknown backend"),
        (["--timeout", "0"], "timeout must be between 1 and 300"),
        (["--timeout", "301"], "timeout must be between 1 and 300"),
        (["--workspace", "/does/not/exist"], "does not exist"),
        (["--mount", "sideways"], "mount.strategy"),
        (["--profile", "no-such-profile"], "unknown profile"),
        (["--memory", "lots"], "limits.memory"),
        ([], "no command given"),
    ],
)
def test_bad_input_exits_125_with_one_clear_line(workspace: Path, args: list[str], needle: str) -> None:
    argv = [*args, "--workspace", str(workspace)] if "--workspace" not in args else args
    done = run(*argv, *([] if needle == "no command given" else ["--", "true"]))
    assert done.returncode == 125
    assert needle in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_malformed_profile_names_file_key_and_problem(workspace: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[limits]\npids = "many"\nbogus = 1\n')
    done = run("--profile", str(bad), "--workspace", str(workspace), "--", "true")
    assert done.returncode == 125
    assert str(bad) in done.stderr and "limits.pids" in done.stderr and "limits.bogus" in done.stderr


def test_profile_requiring_missing_guarantee_refuses(workspace: Path, tmp_path: Path) -> None:
    prof = tmp_path / "strict.toml"
    prof.write_text('backend = "bwrap"\nrequires = ["seccomp"]\n')
    done = run("--profile", str(prof), "--json", "--workspace", str(workspace), "--", "true")
    assert done.returncode == 125
    assert json.loads(done.stdout)["error"]["code"] == "GUARANTEE_UNAVAILABLE"


def test_host_backend_refuses_isolating_profile(workspace: Path) -> None:
    done = run("--backend", "host", "--workspace", str(workspace), "--", "true")
    assert done.returncode == 125 and "GUARANTEE_UNAVAILABLE" in done.stderr


def test_check_and_profiles_commands() -> None:
    check = subprocess.run([SANDBOX, "check", "--json"], capture_output=True, text=True, check=True)
    names = {b["backend"] for b in json.loads(check.stdout)["backends"]}
    assert names == {"bwrap", "docker", "host"}
    listing = subprocess.run([SANDBOX, "profiles"], capture_output=True, text=True, check=True)
    for name in ("default", "readonly", "untrusted"):
        assert f"{name}:" in listing.stdout


@pytest.mark.parametrize("signum", [2, 15])
def test_signal_to_sandbox_run_kills_the_jailed_tree(workspace: Path, signum: int) -> None:
    import time

    from tests.conftest import survivors

    marker = str(700000 + os.getpid() % 1000 * 100 + signum)
    proc = subprocess.Popen([SANDBOX, "run", "--workspace", str(workspace), "--", "sh", "-c",
                             f"trap '' TERM INT; setsid sleep {marker} & sleep {marker}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while len(survivors(marker)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signum)
    assert proc.wait(timeout=30) == 128 + signum
    assert [p for p in survivors(marker) if p != proc.pid] == []


@pytest.fixture(params=[pytest.param("bwrap", marks=pytest.mark.bwrap),
                        pytest.param("docker", marks=pytest.mark.docker)])
def cli_backend(request: pytest.FixtureRequest, workspace: Path) -> str:
    backend_or_skip(request.param)
    if request.param == "docker" and os.geteuid() == 0:
        for path in (workspace, *workspace.rglob("*")):
            os.chown(path, 1000, 1000, follow_symlinks=False)
    return str(request.param)


def test_same_json_contract_and_exit_codes_on_every_backend(cli_backend: str, workspace: Path) -> None:
    done = run("--backend", cli_backend, "--json", "--workspace", str(workspace), "--",
               "sh", "-c", "echo hi; echo oops >&2; exit 3")
    out = json.loads(done.stdout.strip())
    assert (done.returncode, out["exit_code"], out["backend"]) == (3, 3, cli_backend)
    assert (out["stdout"], out["stderr"], out["stdout_bytes"]) == ("hi\n", "oops\n", 3)
    assert run("--backend", cli_backend, "--timeout", "1", "--workspace", str(workspace), "--",
               "sleep", "30").returncode == 124
    assert run("--backend", cli_backend, "--workspace", str(workspace), "--",
               "sh", "-c", "kill -TERM $$").returncode == 143
    copy = run("--backend", cli_backend, "--mount", "copy", "--json", "--workspace", str(workspace), "--",
               "sh", "-c", "echo x > new.txt")
    assert [c["path"] for c in json.loads(copy.stdout)["changes"]] == ["new.txt"]
    assert not (workspace / "new.txt").exists()


@pytest.mark.docker
def test_docker_daemon_unreachable_exits_125(workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    done = run("--backend", "docker", "--json", "--workspace", str(workspace), "--", "true")
    assert done.returncode == 125
    assert json.loads(done.stdout)["error"]["code"] == "BACKEND_UNAVAILABLE"
