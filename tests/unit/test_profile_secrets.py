"""``[secrets.NAME]`` and ``[[network.requests]]`` as a profile states them, and what the jail is given."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from pydantic import ValidationError

from sandbox.errors import InvalidArgument
from sandbox.network.egress import for_profile
from sandbox.network.secrets import Brokered, jail_env, read_value
from sandbox.profile import Profile

if TYPE_CHECKING:
    from pathlib import Path

ALLOWLIST = {"mode": "allowlist"}


def profile(**data: object) -> Profile:
    return Profile.model_validate({"network": ALLOWLIST, **data})


def test_a_secret_needs_an_allowlist_a_known_source_and_a_signing_key_id() -> None:
    with pytest.raises(ValidationError, match="secrets need network.mode = 'allowlist'"):
        Profile.model_validate({"secrets": {"T": {"from": "env:T", "hosts": ["api.test"]}}})
    with pytest.raises(ValidationError, match="comes 'from'"):
        profile(secrets={"T": {"from": "vault:x", "hosts": ["api.test"]}})
    with pytest.raises(ValidationError, match="access_key_id goes with"):
        profile(secrets={"T": {"from": "env:T", "hosts": ["s3.test"], "as": "aws-sigv4"}})
    with pytest.raises(ValidationError, match="invalid network pattern"):
        profile(secrets={"T": {"from": "env:T", "hosts": ["bad host"]}})


def test_request_rules_are_checked_when_the_profile_loads() -> None:
    with pytest.raises(ValidationError):
        profile(network={**ALLOWLIST, "requests": [{"hosts": ["api.test"], "allow": ["GET no-slash"]}]})


def test_the_secrets_and_rules_hosts_join_the_allowlist() -> None:
    loaded = profile(
        secrets={"T": {"from": "env:T", "hosts": ["api.test"]}},
        network={**ALLOWLIST, "requests": [{"hosts": ["git.test"], "preset": "read-only"}]},
    )
    assert {"api.test", "git.test"} <= set(for_profile(loaded).allow)


def test_a_value_is_read_from_env_or_file_and_its_failures_name_the_secret_not_the_value(tmp_path: Path) -> None:
    assert read_value("T", "env:T", {"T": "value-of-t\n"}) == "value-of-t"
    (tmp_path / "token").write_text("from-file\n")
    assert read_value("T", f"file:{tmp_path / 'token'}") == "from-file"
    with pytest.raises(InvalidArgument, match="secret T: the variable T is not set"):
        read_value("T", "env:T", {})
    with pytest.raises(InvalidArgument, match="is not a one-line credential"):
        read_value("T", "env:T", {"T": "two\nlines"})
    with pytest.raises(InvalidArgument, match="shorter than 8 characters"):
        read_value("T", "env:T", {"T": "abc"})


def test_the_jail_gets_placeholders_and_git_credentials_never_the_value() -> None:
    loaded = profile(
        secrets={
            "GH": {"from": "env:GH", "hosts": ["git.test"], "as": "basic"},
            "API": {"from": "env:API", "hosts": ["api.test:8443"], "as": "bearer", "env": "API_TOKEN"},
        }
    )
    brokered = [
        Brokered.read(name, spec, {"GH": "gh-value", "API": "api-value"}) for name, spec in loaded.secrets.items()
    ]
    env = jail_env(brokered, "/run/sandbox-net/ca-bundle.pem")
    assert "gh-value" not in repr(env) and "api-value" not in repr(env) and "gh-value" not in repr(brokered)
    assert env["GH"] == brokered[0].placeholder and env["API_TOKEN"] == brokered[1].placeholder
    config = {env[f"GIT_CONFIG_KEY_{i}"]: env[f"GIT_CONFIG_VALUE_{i}"] for i in range(int(env["GIT_CONFIG_COUNT"]))}
    assert brokered[0].placeholder in config["credential.https://git.test.helper"]
    assert config["http.https://api.test:8443/.extraHeader"] == f"Authorization: Bearer {brokered[1].placeholder}"
    assert config["http.sslCAInfo"] == "/run/sandbox-net/ca-bundle.pem"


def test_policy_show_names_the_secrets_and_rules_never_a_value(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from sandbox.cli import main

    profile_file = tmp_path / "push.toml"
    profile_file.write_text(
        '[network]\nmode = "allowlist"\n[secrets.GH]\nfrom = "env:GH_SHOW"\nhosts = ["github.com"]\nas = "basic"\n'
        '[[network.requests]]\nhosts = ["github.com"]\ngit_push = ["me/project"]\ngit_refs = ["refs/heads/agent/*"]\n'
    )
    assert main(["policy", "show", "--profile", str(profile_file), "--workspace", str(tmp_path)]) == 0
    shown = capsys.readouterr().out
    assert "network: allowlist; allow github.com;" in shown
    assert "secret GH: basic to github.com (the jail holds a placeholder)" in shown
    assert "requests to github.com: git fetch; git push to me/project (refs refs/heads/agent/*)" in shown
