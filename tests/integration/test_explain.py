"""Issue 32, items 5 and 7: a timeout and a refusal say what to do next (real bubblewrap).

A timeout names its limit, where it came from and how to raise it, on ``sandbox run``'s stderr
(the quick path and the full one), in ``--json`` (``timeout_source``) and in a Bash tool call's
result. A GUARANTEE_UNAVAILABLE refusal, driven as an ordinary user (this host has cgroup v1,
which no ordinary user gets a memory cgroup from), names what required the guarantee, the
shipped profiles that would run here and what each gives up, and the host change that would
give it; ``--mount overlay`` is blamed on the flag, with ``--mount copy`` as the way round.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import backend_or_skip
from tests.integration._cli import sandbox, shell

pytestmark = pytest.mark.bwrap

Run = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture(autouse=True)
def _need_bwrap() -> None:
    backend_or_skip("bwrap")


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return sandbox("run", *args, text=True)


@pytest.fixture(params=["full", "quick"])
def run_path(request: pytest.FixtureRequest, workspace: Path, data_dir: Path) -> str:
    """The full path (a profile's first run here) or the quick one (its validated profile cached)."""
    if request.param == "quick":
        assert run("--workspace", str(workspace), "--", "true").returncode == 0
        assert list((data_dir / "cache" / "profiles").glob("*.json")), "no quick path to take"
    return str(request.param)


def short_profile(tmp_path: Path, default_s: int, max_s: int) -> Path:
    path = tmp_path / "short.toml"
    path.write_text(f'backend = "bwrap"\n[timeouts]\ndefault_s = {default_s}\nmax_s = {max_s}\nkill_grace_s = 0\n')
    return path


# ---- timeouts --------------------------------------------------------------------------------------


@pytest.mark.usefixtures("run_path")
def test_a_timeout_names_the_flag_and_how_far_it_may_go(workspace: Path) -> None:
    done = run("--timeout", "1", *shell(workspace, "sleep 30"))
    assert done.returncode == 124
    assert "timed out after 1 s, the limit set by --timeout 1" in done.stderr
    assert "to allow longer: --timeout S, up to 3600 s (1 h) (profile default's timeouts.max_s)" in done.stderr


def test_a_timeout_names_the_profile_file_and_key(workspace: Path, tmp_path: Path, data_dir: Path) -> None:
    path = short_profile(tmp_path, 1, 120)
    for _ in ("full", "quick"):
        done = run("--profile", str(path), *shell(workspace, "sleep 30"))
        assert done.returncode == 124
        assert f"the limit set by profile short ({path}): timeouts.default_s = 1" in done.stderr
        assert "--timeout S, up to 120 s (2 min) (profile short's timeouts.max_s)" in done.stderr
    assert list((data_dir / "cache" / "profiles").glob("*.json")), "the second run did not take the quick path"


def test_a_timeout_at_the_ceiling_names_the_profiles_with_a_higher_one(workspace: Path, tmp_path: Path) -> None:
    done = run("--profile", str(short_profile(tmp_path, 1, 1)), *shell(workspace, "sleep 30"))
    assert done.returncode == 124
    assert "1 s is profile short's timeouts.max_s, the ceiling" in done.stderr
    assert "ci (21600 s (6 h))" in done.stderr


def test_json_carries_the_timeout_source(workspace: Path) -> None:
    done = run("--json", "--timeout", "1", *shell(workspace, "sleep 30"))
    assert done.returncode == 124
    source = json.loads(done.stdout)["timeout_source"]
    assert (source["kind"], source["limit_s"], source["origin"], source["max_s"]) == ("flag", 1.0, "--timeout 1", 3600)
    assert source["raise"].startswith("to allow longer: --timeout S")
    ok = json.loads(run("--json", *shell(workspace, "true")).stdout)["timeout_source"]
    assert (ok["kind"], ok["limit_s"], ok["origin"]) == ("profile", 60.0, "profile default: timeouts.default_s = 60")


def test_a_bash_calls_timeout_says_how_to_raise_it(workspace: Path) -> None:
    args = json.dumps({"command": "sleep 30", "timeout": 1})
    done = sandbox("tool", "Bash", "--args", args, "--json", "--workspace", str(workspace), text=True)
    result = json.loads(done.stdout)
    assert result["error_code"] == "TIMEOUT"
    assert result["details"]["timeout"]["kind"] == "call"
    assert "the call's timeout argument (1 s)" in result["content"]
    assert "up to 3600 s (1 h) (profile default's timeouts.max_s)" in result["content"]


# ---- refusals, as an ordinary user ------------------------------------------------------------------


@pytest.fixture
def as_user(tmp_path: Path) -> Iterator[Run]:
    """``sandbox ARGS`` as an ordinary user, in a workspace of its own: ourselves when we are one;
    as root, user ``SANDBOX_CI_USER`` (sandboxci) through runuser, with ``SANDBOX_USER_PYTHON``
    (default: ours) running this checkout."""
    if os.geteuid() != 0:
        ws = tmp_path / "user-ws"
        ws.mkdir()
        yield lambda *args: sandbox(args[0], "--workspace", str(ws), *args[1:], text=True)
        return
    user = os.environ.get("SANDBOX_CI_USER", "sandboxci")
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        pytest.skip(f"no ordinary user {user} to run as (useradd -m {user})")
    python = os.environ.get("SANDBOX_USER_PYTHON", sys.executable)
    root = Path(__file__).resolve().parents[2]
    home = Path(entry.pw_dir) / f"explain-test-{os.getpid()}"
    (home / "ws").mkdir(parents=True)
    shutil.chown(home, user)
    shutil.chown(home / "ws", user)
    env = [f"HOME={entry.pw_dir}", f"PATH={os.environ['PATH']}", f"PYTHONPATH={root}", f"SANDBOX_DATA_DIR={home}/data"]
    prefix = ["runuser", "-u", user, "--", "env", "-i", *env, python, "-m", "sandbox.cli"]
    try:
        usable = subprocess.run([*prefix, "--help"], capture_output=True, text=True, timeout=60, check=False)
        if usable.returncode != 0:
            why = (usable.stderr.strip().splitlines() or ["no output"])[-1]
            pytest.skip(f"user {user} cannot run {python} on this checkout ({why}); set SANDBOX_USER_PYTHON")

        def call(*args: str) -> subprocess.CompletedProcess[str]:
            argv = [*prefix, args[0], "--workspace", str(home / "ws"), *args[1:]]
            return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)

        yield call
    finally:
        shutil.rmtree(home, ignore_errors=True)


def refused(done: subprocess.CompletedProcess[str], what: str) -> dict[str, Any]:
    if done.returncode == 0:
        pytest.skip(f"this host gives an ordinary user {what}: nothing is refused")
    assert done.returncode == 125, done.stderr
    error: dict[str, Any] = json.loads(done.stdout)["error"]
    assert error["code"] == "GUARANTEE_UNAVAILABLE"
    return error


def test_an_ordinary_user_refused_untrusted_is_shown_the_way_forward(as_user: Run) -> None:
    error = refused(as_user("run", "--profile", "untrusted", "--json", "--", "true"), "memory cgroups")
    data, message = error["data"], error["message"]
    assert message.startswith("profile 'untrusted' needs what this host cannot give: memory-limit")
    assert data["required_by"]["memory-limit"].startswith("profile untrusted, requires")
    runs = {alt["profile"]: alt for alt in data["runs_here"]}
    assert "default" in runs and "trusted" not in runs  # never the host backend
    assert "memory-limit" in runs["default"]["gives_up"]
    assert runs["default"]["differs"]["mount.strategy"] == "rw (not copy)"
    [change] = data["remedy"]["memory-limit"]
    cgroup_v2 = Path("/sys/fs/cgroup/cgroup.controllers").exists()
    assert ("systemd.unified_cgroup_hierarchy=1" in change) != cgroup_v2
    assert "systemd-run --user --scope -p Delegate=yes" in change and "run as root" in change
    assert "would run here: --profile default (bwrap; gives up memory-limit" in message


def test_the_refusal_on_stderr_has_the_way_forward_too(as_user: Run) -> None:
    done = as_user("run", "--profile", "ci", "--", "true")
    if done.returncode == 0:
        pytest.skip("this host gives an ordinary user memory cgroups: nothing is refused")
    lines = done.stderr.splitlines()
    assert lines[0].startswith("sandbox: GUARANTEE_UNAVAILABLE: profile 'ci' needs what this host cannot give")
    assert any(line.startswith("  required by: memory-limit: profile ci, requires") for line in lines)
    assert any(line.startswith("  to get memory-limit: ") for line in lines)


def test_mount_overlay_is_blamed_on_the_flag(as_user: Run) -> None:
    error = refused(as_user("run", "--mount", "overlay", "--json", "--", "true"), "overlay mounts")
    assert error["message"].startswith("--mount overlay needs what this host cannot give: overlay")
    assert "profile 'default' requires" not in error["message"]
    assert error["data"]["required_by"] == {"overlay": "--mount overlay"}
    assert error["data"]["remedy"]["overlay"][0].startswith("--mount copy")
