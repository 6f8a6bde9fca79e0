"""Package indexes by name (issue 32): ``resolve``, ``[network] indexes``, ``--allow-index``, the
``untrusted-deps`` profile, and the network-off line a failed install under ``network none`` gets."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest

from sandbox import cli
from sandbox import profile as profiles
from sandbox.errors import InvalidArgument
from sandbox.network import indexes
from sandbox.network.egress import for_profile
from sandbox.network.hint import network_off

if TYPE_CHECKING:
    from pathlib import Path

MIRROR = "http://10.0.0.5:3141/root/pypi/+simple/"

# -- resolve ---------------------------------------------------------------------------------------


def test_a_name_opens_its_ecosystems_hosts_and_sets_nothing() -> None:
    found = indexes.resolve(["pypi", "npm"])
    assert found.hosts == ("pypi.org", "files.pythonhosted.org", "registry.npmjs.org")
    assert found.env == {}


def test_a_mirror_opens_its_host_and_port_only_and_points_the_installers_at_it() -> None:
    found = indexes.resolve([f"pypi={MIRROR}", "npm=https://npm.example.com/"])
    assert found.hosts == ("10.0.0.5:3141", "npm.example.com:443")
    assert found.env["PIP_INDEX_URL"] == found.env["UV_INDEX_URL"] == MIRROR
    assert found.env["npm_config_registry"] == "https://npm.example.com/"


def test_a_plain_http_python_mirror_is_trusted_by_pip_and_uv() -> None:
    """pip ignores an http:// index it was not told to trust: the named mirror must still work."""
    assert indexes.resolve([f"pypi={MIRROR}"]).env["PIP_TRUSTED_HOST"] == "10.0.0.5"
    assert "PIP_TRUSTED_HOST" not in indexes.resolve(["pypi=https://pypi.example.com/simple/"]).env
    assert "PIP_TRUSTED_HOST" not in indexes.resolve(["npm=http://10.0.0.5:4873/"]).env


@pytest.mark.parametrize("spec", ["pypy", "crates=https://x.example/", "pypi=ftp://x.example/", "pypi=http:///x"])
def test_a_bad_spec_is_refused(spec: str) -> None:
    with pytest.raises(InvalidArgument):
        indexes.resolve([spec])


# -- the profile -----------------------------------------------------------------------------------


def allowlisted(**network: object) -> profiles.Profile:
    return profiles.load("default").override({"network.mode": "allowlist", **network})


def test_a_profiles_indexes_join_the_allowlist_the_proxy_enforces_and_the_jails_environment() -> None:
    prof = allowlisted(**{"network.indexes": ["pypi", f"go={MIRROR}"], "network.allow": ["github.com"]})
    assert for_profile(prof).allow == ("github.com", "pypi.org", "files.pythonhosted.org", "10.0.0.5:3141")
    assert prof.env.set["GOPROXY"] == MIRROR
    again = prof.override({"limits.pids": 64})  # validated again: nothing doubles
    assert again.network.allow == prof.network.allow and again.env.set == prof.env.set


def test_indexes_need_the_allowlist_network() -> None:
    with pytest.raises(InvalidArgument, match="network.indexes needs network.mode = 'allowlist'"):
        profiles.load("default").override({"network.indexes": ["pypi"]})


def test_a_bad_index_is_blamed_on_the_flag() -> None:
    with pytest.raises(InvalidArgument) as info:
        profiles.load("default").override(
            {"network.mode": "allowlist", "network.indexes": ["pypy"]}, {"network.indexes": "--allow-index"}
        )
    assert info.value.message.startswith("--allow-index: unknown package index 'pypy'")


def test_untrusted_deps_is_untrusted_with_a_confined_network() -> None:
    deps, untrusted = profiles.load("untrusted-deps"), profiles.load("untrusted")
    assert set(deps.requires) == set(untrusted.requires) - {"net-none"} | {"net-confined"}
    assert (deps.network.mode, deps.network.allow, deps.network.indexes) == ("allowlist", (), ())
    assert (deps.mount.strategy, deps.mount.exclude) == ("copy", ())
    assert deps.limits.memory == 2 * 2**30 and deps.limits.pids == 512
    assert (deps.timeouts.default_s, deps.timeouts.max_s) == (900, 7200)
    with pytest.raises(InvalidArgument):  # an allowlist, never the host's network
        deps.override({"network.mode": "host"}, {"network.mode": "--network"})


# -- the command line ------------------------------------------------------------------------------


def run_json(capsys: pytest.CaptureFixture[str], tmp_path: Path, *args: str) -> tuple[int, dict[str, object]]:
    code = cli.main(["run", "--json", "--workspace", str(tmp_path), *args, "--", "true"])
    return code, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(("profile", "flag"), [("untrusted", "--allow-index"), ("readonly", "--allow-host")])
def test_a_net_none_profile_refuses_the_flag_and_names_untrusted_deps(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, profile: str, flag: str
) -> None:
    code, out = run_json(capsys, tmp_path, "--profile", profile, flag, "pypi" if flag == "--allow-index" else "x.org")
    assert code == 125
    error = out["error"]
    assert isinstance(error, dict) and error["code"] == "INVALID_ARGUMENT"
    assert error["message"].startswith(flag) and "--profile untrusted-deps --allow-index pypi" in error["message"]


def test_allow_index_with_another_network_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out = run_json(capsys, tmp_path, "--allow-index", "pypi", "--network", "none")
    assert code == 125 and "--allow-index needs --network allowlist" in str(out["error"])


def test_the_flag_reaches_the_profile() -> None:
    from sandbox.cli import run as cli_run

    argv = ["run", "--profile", "untrusted-deps", "--allow-index", f"pypi={MIRROR}", "--", "true"]
    prof = cli_run._load_profile(cli.build_parser().parse_args(argv))
    assert "10.0.0.5:3141" in prof.network.allow and prof.env.set["PIP_INDEX_URL"] == MIRROR


# -- the network-off line --------------------------------------------------------------------------

PIP = (
    "WARNING: Retrying (Retry(total=4, connect=None, read=None, redirect=None, status=None)) after connection "
    "broken by 'NewConnectionError('<pip._vendor.urllib3.connection.HTTPSConnection object at 0x7f>: Failed to "
    "establish a new connection: [Errno -3] Temporary failure in name resolution')': /simple/labpkg/\n"
    "ERROR: Could not find a version that satisfies the requirement labpkg (from versions: none)\n"
)


@pytest.mark.parametrize(
    ("stderr", "index"),
    [
        (PIP, "pypi"),
        ("ERROR: No matching distribution found for labpkg (from versions: none)\n", "pypi"),
        ("npm error code EAI_AGAIN\nnpm error request to https://registry.npmjs.org/tape failed\n", "npm"),
        ("npm ERR! code ENOTFOUND\nnpm ERR! errno ENOTFOUND\n", "npm"),
        (
            "error: failed to get `rand` as a dependency\nCaused by:\n  download of config.json failed\n"
            "  [6] Couldn't resolve host name (Could not resolve host: index.crates.io)\n",
            "crates",
        ),
        (
            'go: github.com/x/y@v1: Get "https://proxy.golang.org/github.com/x/y/@v/list": dial tcp: lookup '
            "proxy.golang.org on 127.0.0.53:53: no such host\n",
            "go",
        ),
    ],
)
def test_an_install_that_found_no_network_names_its_index(stderr: str, index: str) -> None:
    line = network_off(stderr, profile="untrusted", needs_other_profile=True)
    assert line == (
        "this jail has no network (profile untrusted: network none); "
        f"to install packages: --profile untrusted-deps --allow-index {index}"
    )


def test_curl_and_git_name_the_host_and_a_confined_profile_needs_only_the_flag() -> None:
    curl = network_off("curl: (6) Could not resolve host: example.com\n", profile="default", needs_other_profile=False)
    assert curl == "this jail has no network (profile default: network none); to reach example.com: " + (
        "--allow-host example.com"
    )
    git = "fatal: unable to access 'https://github.com/a/b.git/': Could not resolve host: github.com\n"
    assert network_off(git, profile="untrusted", needs_other_profile=True) == (
        "this jail has no network (profile untrusted: network none); "
        "to reach github.com: --profile untrusted-deps --allow-host github.com"
    )


@pytest.mark.parametrize(
    "stderr", ["", "FAILED tests/test_x.py::test_y - AssertionError\n", "npm error code E404\n", "Permission denied\n"]
)
def test_other_failures_get_no_line(stderr: str) -> None:
    assert network_off(stderr, profile="untrusted", needs_other_profile=True) is None


# -- session.open ----------------------------------------------------------------------------------


def test_session_open_takes_allow_indexes_as_the_flag_does() -> None:
    from sandbox.policy.approvals import CallbackApprover
    from sandbox.server_messages import SessionOpenParams
    from sandbox.session.opening import profile_for

    async def deny(_request: object) -> str:
        return "deny"

    params = SessionOpenParams(workspace="/w", profile="untrusted-deps", allow_indexes=["npm"])
    prof = profile_for(params.options(CallbackApprover(deny)))
    assert prof.network.mode == "allowlist" and "registry.npmjs.org" in prof.network.allow
    with pytest.raises(InvalidArgument) as refused:
        profile_for({"profile": "untrusted", "allow_indexes": ["pypi"]})
    assert refused.value.message.startswith("allow_indexes allowlist") and "untrusted-deps" in refused.value.message
