"""The ``sandbox run`` contract, through the installed console script (real bubblewrap)."""

from __future__ import annotations

import json
import os
import subprocess
from typing import TYPE_CHECKING

import pytest

from tests.conftest import backend_or_skip, profile_or_skip
from tests.integration._cli import SANDBOX, sandbox, shell

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

pytestmark = pytest.mark.bwrap


@pytest.fixture(autouse=True)
def _need_bwrap() -> None:
    backend_or_skip("bwrap")


def run(*args: str, cwd: Path | None = None, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return sandbox("run", *args, text=True, cwd=cwd, input=stdin)


@pytest.fixture(params=["full", "quick"])
def run_path(request: pytest.FixtureRequest, workspace: Path, data_dir: Path) -> Iterator[str]:
    """``sandbox run``'s full path (a profile's first run here) or its quick one (sandbox.cli.launch),
    for tests whose runs give no key flag (see ``cli_backend``)."""
    if request.param == "full":
        yield "full"
        return
    assert run("--workspace", str(workspace), "--", "true").returncode == 0
    [entry] = quick_cache(data_dir)
    written = entry.stat().st_mtime_ns
    yield "quick"
    assert entry.stat().st_mtime_ns == written, "a run took the full path"


@pytest.mark.usefixtures("run_path")
def test_streams_go_to_ours_and_exit_code_is_the_commands(workspace: Path) -> None:
    done = run("--", "sh", "-c", "echo out; echo err >&2; exit 7", cwd=workspace)
    assert (done.returncode, done.stdout, done.stderr) == (7, "out\n", "err\n")


def test_json_contract(workspace: Path) -> None:
    done = run("--json", "--workspace", str(workspace), "--", "sh", "-c", "echo hi; echo oops >&2")
    assert done.returncode == 0
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1
    out = json.loads(lines[0])
    for key in (
        "exit_code",
        "signal",
        "timed_out",
        "aborted",
        "stdout",
        "stderr",
        "stdout_bytes",
        "stderr_bytes",
        "stdout_truncated",
        "stderr_truncated",
        "duration_ms",
        "backend",
        "profile",
        "mount",
        "changes",
    ):
        assert key in out, key
    assert (out["stdout"], out["stderr"], out["backend"], out["mount"]) == ("hi\n", "oops\n", "bwrap", "rw")


def test_timeout_exits_124_and_kills_every_process(workspace: Path, run_path: str) -> None:
    from tests.conftest import survivors

    marker = str(710000 + os.getpid() % 1000 * 10 + (run_path == "quick"))
    done = run(
        "--timeout",
        "1",
        *shell(workspace, f"trap '' TERM; setsid sleep {marker} & sleep {marker}"),
    )
    assert done.returncode == 124
    assert "timed out" in done.stderr
    assert survivors(marker) == []


@pytest.mark.usefixtures("run_path")
def test_signal_exits_128_plus_n(workspace: Path) -> None:
    done = run("--workspace", str(workspace), "--", "sh", "-c", "kill -TERM $$")
    assert done.returncode == 143


def test_copy_mount_without_apply_leaves_host_unchanged(workspace: Path) -> None:
    done = run(
        "--mount", "copy", "--json", "--workspace", str(workspace), "--", "sh", "-c", "echo x > added.txt; rm README.md"
    )
    out = json.loads(done.stdout)
    assert {(c["path"], c["status"]) for c in out["changes"]} == {("added.txt", "added"), ("README.md", "deleted")}
    assert (workspace / "README.md").exists() and not (workspace / "added.txt").exists()


def test_copy_mount_with_apply_changes_host(workspace: Path) -> None:
    done = run(
        "--mount",
        "copy",
        "--apply",
        *shell(workspace, "echo x > added.txt; rm README.md"),
    )
    assert done.returncode == 0, done.stderr
    assert not (workspace / "README.md").exists() and (workspace / "added.txt").read_text() == "x\n"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--backend", "nope"], "unknown backend"),
        (["--timeout", "0"], "timeout must be between 1 and 3600"),
        (["--timeout", "3601"], "timeout must be between 1 and 3600"),
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


def test_profile_requiring_missing_guarantee_refuses(
    workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A host without libseccomp: the binding's import fails there, so the bwrap jail has no filter.
    (tmp_path / "nolib").mkdir()
    (tmp_path / "nolib" / "pyseccomp.py").write_text('raise OSError("libseccomp.so.2: cannot open shared object")\n')
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "nolib"))
    prof = tmp_path / "strict.toml"
    prof.write_text('backend = "bwrap"\nrequires = ["seccomp"]\n')
    done = run("--profile", str(prof), "--json", "--workspace", str(workspace), "--", "true")
    assert done.returncode == 125
    error = json.loads(done.stdout)["error"]
    assert error["code"] == "GUARANTEE_UNAVAILABLE" and "libseccomp" in error["message"]


def test_host_backend_refuses_isolating_profile(workspace: Path) -> None:
    done = run("--backend", "host", "--workspace", str(workspace), "--", "true")
    assert done.returncode == 125 and "GUARANTEE_UNAVAILABLE" in done.stderr


def test_check_and_profiles_commands() -> None:
    check = subprocess.run([SANDBOX, "check", "--json"], capture_output=True, text=True, check=True)
    backends = {b["backend"]: b for b in json.loads(check.stdout)["backends"]}
    assert set(backends) == {"bwrap", "docker", "landlock", "microvm", "host", "winjob"}
    # Listed on Linux, never available there, and saying why (tests/wine runs it under Wine).
    assert not backends["winjob"]["available"] and "Windows" in backends["winjob"]["reason"]
    listing = subprocess.run([SANDBOX, "profiles"], capture_output=True, text=True, check=True)
    for name in ("default", "readonly", "untrusted"):
        assert f"{name}:" in listing.stdout


@pytest.mark.parametrize("signum", [2, 15])
def test_signal_to_sandbox_run_kills_the_jailed_tree(workspace: Path, signum: int, run_path: str) -> None:
    import time

    from tests.conftest import survivors

    marker = str(700000 + os.getpid() % 1000 * 100 + signum * 2 + (run_path == "quick"))
    proc = subprocess.Popen(
        [
            SANDBOX,
            "run",
            *shell(workspace, f"trap '' TERM INT; setsid sleep {marker} & sleep {marker}"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 20
    while len(survivors(marker)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signum)
    assert proc.wait(timeout=30) == 128 + signum
    assert [p for p in survivors(marker) if p != proc.pid] == []


def quick_cache(data_dir: Path) -> list[Path]:
    return sorted((data_dir / "cache" / "profiles").glob("*.json"))


@pytest.fixture(
    params=[
        pytest.param("bwrap", marks=pytest.mark.bwrap),
        pytest.param("bwrap-quick", marks=pytest.mark.bwrap),
        pytest.param("docker", marks=pytest.mark.docker),
    ]
)
def cli_backend(request: pytest.FixtureRequest, workspace: Path, data_dir: Path) -> Iterator[str]:
    """The backend a test's runs name; ``bwrap-quick``: bwrap, each run on the quick path (sandbox.cli.launch).

    The quick path takes a profile and flags the full path has accepted here before: a first run
    of ``true`` with the same flags warms it. The full path rewrites that cache entry at each run
    it makes, so an entry left untouched by the test proves that every run took the quick path.
    """
    backend = str(request.param).removesuffix("-quick")
    backend_or_skip(backend)
    if backend == "docker" and os.geteuid() == 0:
        for path in (workspace, *workspace.rglob("*")):
            os.chown(path, 1000, 1000, follow_symlinks=False)
    if request.param != "bwrap-quick":
        yield backend
        return
    assert run("--backend", backend, "--workspace", str(workspace), "--", "true").returncode == 0
    [entry] = quick_cache(data_dir)
    written = entry.stat().st_mtime_ns
    yield backend
    if request.node.get_closest_marker("full_path") is None:
        assert entry.stat().st_mtime_ns == written, "a run took the full path"


@pytest.mark.full_path  # --json always takes it
def test_same_json_contract_and_exit_codes_on_every_backend(cli_backend: str, workspace: Path) -> None:
    done = run(
        "--backend",
        cli_backend,
        "--json",
        *shell(workspace, "echo hi; echo oops >&2; exit 3"),
    )
    out = json.loads(done.stdout.strip())
    assert (done.returncode, out["exit_code"], out["backend"]) == (3, 3, cli_backend)
    assert (out["stdout"], out["stderr"], out["stdout_bytes"]) == ("hi\n", "oops\n", 3)
    assert (
        run("--backend", cli_backend, "--timeout", "1", "--workspace", str(workspace), "--", "sleep", "30").returncode
        == 124
    )
    assert (
        run("--backend", cli_backend, "--workspace", str(workspace), "--", "sh", "-c", "kill -TERM $$").returncode
        == 143
    )
    copy = run(
        "--backend",
        cli_backend,
        "--mount",
        "copy",
        "--json",
        *shell(workspace, "echo x > new.txt"),
    )
    assert [c["path"] for c in json.loads(copy.stdout)["changes"]] == ["new.txt"]
    assert not (workspace / "new.txt").exists()


@pytest.mark.docker
def test_docker_daemon_unreachable_exits_125(workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    done = run("--backend", "docker", "--json", "--workspace", str(workspace), "--", "true")
    assert done.returncode == 125
    assert json.loads(done.stdout)["error"]["code"] == "BACKEND_UNAVAILABLE"


# -- issue 9, item 4: flags never override a profile's requirements -------------------------------


def test_a_flag_contradicting_a_required_guarantee_is_refused(workspace: Path) -> None:
    done = run("--profile", "untrusted", "--network", "host", "--json", "--workspace", str(workspace), "--", "true")
    assert done.returncode == 125
    assert len(done.stderr.strip().splitlines()) == 1
    assert "net-none" in done.stderr and "--network host" in done.stderr
    error = json.loads(done.stdout)["error"]
    assert (error["code"], error["data"]["guarantee"]) == ("INVALID_ARGUMENT", "net-none")


def test_json_reports_the_network_and_every_limit_in_force(workspace: Path) -> None:
    profile_or_skip("untrusted")
    done = run("--profile", "untrusted", "--memory", "256MiB", "--json", "--workspace", str(workspace), "--", "true")
    out = json.loads(done.stdout)
    assert done.returncode == 0, done.stderr
    assert out["network"] == {"mode": "none", "allow": [], "deny": [], "ask": False, "denials": []}
    assert out["limits"] == {
        "memory": 256 * 2**20,
        "pids": 128,
        "cpus": None,
        "cpu_time_s": 3600,
        "file_size": 256 * 2**20,
        "tmp_size": 128 * 2**20,
        "nofile": 1024,
    }
    assert out["timeout_s"] == 600  # issue 32: untrusted's default fits a real suite


# -- item 5: a Unix tool ------------------------------------------------------------------------------


def test_stdin_is_forwarded(cli_backend: str, workspace: Path) -> None:
    done = run("--backend", cli_backend, "--workspace", str(workspace), "--", "cat", stdin="hi\nthere\n")
    assert (done.returncode, done.stdout) == (0, "hi\nthere\n"), done.stderr


def test_stdin_streams_and_is_never_read_whole_first(cli_backend: str, workspace: Path) -> None:
    yes = subprocess.Popen(["yes"], stdout=subprocess.PIPE)
    try:
        assert yes.stdout is not None
        done = subprocess.run(
            [SANDBOX, "run", "--backend", cli_backend, "--workspace", str(workspace), "--", "head", "-1"],
            stdin=yes.stdout,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        yes.kill()
        yes.wait()
        if yes.stdout is not None:
            yes.stdout.close()
    assert (done.returncode, done.stdout) == (0, "y\n"), done.stderr


def test_a_closed_stdout_ends_the_call_like_sigpipe(cli_backend: str, workspace: Path) -> None:
    proc = subprocess.Popen(
        [SANDBOX, "run", "--backend", cli_backend, "--workspace", str(workspace), "--", "yes"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline() == b"y\n"
    proc.stdout.close()  # what `| head -1` does once it has its line
    code = proc.wait(timeout=60)
    err = proc.stderr.read().decode()
    proc.stderr.close()
    assert code == 141, err
    assert "Traceback" not in err and "BrokenPipe" not in err


def test_command_not_found_exits_127_with_one_line(cli_backend: str, workspace: Path) -> None:
    done = run("--backend", cli_backend, "--workspace", str(workspace), "--", "no-such-command-x", "arg")
    assert done.returncode == 127
    assert len(done.stderr.strip().splitlines()) == 1 and "no-such-command-x" in done.stderr
    missing = run("--backend", cli_backend, "--workspace", str(workspace), "--", "./nope/tool")
    assert missing.returncode == 127 and "./nope/tool" in missing.stderr


def test_command_that_cannot_be_executed_exits_126(cli_backend: str, workspace: Path) -> None:
    script = workspace / "plain.sh"
    script.write_text("echo hi\n")
    if cli_backend == "docker" and os.geteuid() == 0:
        os.chown(script, 1000, 1000)
    for target in ("./plain.sh", "./src"):
        done = run("--backend", cli_backend, "--workspace", str(workspace), "--", target)
        assert done.returncode == 126, (target, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1 and target in done.stderr


def test_a_command_linking_into_a_hidden_part_of_the_host_says_so(
    cli_backend: str, workspace: Path, tmp_path: Path
) -> None:
    # A venv whose python links outside the workspace, into a directory the jail does not show.
    hidden = tmp_path / "hidden-pyenv" / "bin"
    hidden.mkdir(parents=True)
    (hidden / "python3").symlink_to("/bin/true")
    (workspace / "venv-bin").mkdir()
    (workspace / "venv-bin" / "python").symlink_to(hidden / "python3")
    done = run("--backend", cli_backend, "--workspace", str(workspace), "--", "venv-bin/python", "-V")
    assert done.returncode == 127
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "venv-bin/python" in lines[0]
    assert str(hidden / "python3") in lines[0] and "does not show" in lines[0]


def test_the_commands_own_127_is_not_rewritten(workspace: Path) -> None:
    done = run("--workspace", str(workspace), "--", "sh", "-c", "echo mine >&2; exit 127")
    assert (done.returncode, done.stderr) == (127, "mine\n")


# -- item 6: limits and sizes say what they mean ------------------------------------------------------


def test_sizes_are_binary(workspace: Path) -> None:
    done = run("--memory", "2G", "--json", "--workspace", str(workspace), "--", "true")
    assert json.loads(done.stdout)["limits"]["memory"] == 2 * 2**30


@pytest.mark.parametrize(
    ("flag", "value"), [("--memory", "0"), ("--memory", "0.1"), ("--memory", "1k"), ("--pids", "3"), ("--pids", "0")]
)
def test_nonsense_limits_are_refused_naming_the_flag(workspace: Path, flag: str, value: str) -> None:
    done = run(flag, value, "--workspace", str(workspace), "--", "true")
    assert done.returncode == 125
    assert len(done.stderr.strip().splitlines()) == 1
    assert f"{flag}:" in done.stderr and ".toml" not in done.stderr


@pytest.mark.parametrize(("profile", "timeout"), [("ci", "400"), ("untrusted", "600")])
def test_profiles_allow_timeouts_beyond_five_minutes(workspace: Path, profile: str, timeout: str) -> None:
    profile_or_skip(profile)
    done = run("--profile", profile, "--timeout", timeout, "--json", "--workspace", str(workspace), "--", "true")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["timeout_s"] == float(timeout)


@pytest.mark.usefixtures("run_path")
def test_a_terminal_on_stdin_is_not_forwarded(workspace: Path) -> None:
    import pty

    parent, child = pty.openpty()
    try:
        done = subprocess.run(
            [SANDBOX, "run", "--workspace", str(workspace), "--", "cat"],
            stdin=child,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(parent)
        os.close(child)
    assert (done.returncode, done.stdout) == (0, ""), done.stderr


def test_large_stdin_arrives_whole_and_an_unread_one_does_not_hold_the_call(cli_backend: str, workspace: Path) -> None:
    data = os.urandom(3 * 2**20 + 17)
    common = [SANDBOX, "run", "--backend", cli_backend, "--workspace", str(workspace), "--"]
    counted = subprocess.run([*common, "wc", "-c"], input=data, capture_output=True, timeout=120, check=False)
    assert (counted.returncode, counted.stdout.strip()) == (0, str(len(data)).encode()), counted.stderr
    ignored = subprocess.run([*common, "true"], input=data, capture_output=True, timeout=120, check=False)
    assert ignored.returncode == 0, ignored.stderr
