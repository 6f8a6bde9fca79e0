"""The user's own network list (``sandbox policy network``): what it keeps, what it refuses."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from sandbox.errors import InvalidArgument
from sandbox.network.egress import for_profile
from sandbox.network.userlist import UserNetwork
from sandbox.profile import Profile

if TYPE_CHECKING:
    from pathlib import Path


def test_patterns_are_added_once_removed_and_a_bad_one_refused(tmp_path: Path) -> None:
    store = UserNetwork(tmp_path / "network.json")
    assert store.load() == {"allow": (), "deny": ()} and store.stamp() is None
    store.add("allow", "api.test")
    store.add("allow", "api.test")
    store.add("deny", "evil.test:443")
    assert store.load() == {"allow": ("api.test",), "deny": ("evil.test:443",)}
    assert store.remove("api.test") and not store.remove("api.test")
    with pytest.raises(InvalidArgument, match="invalid network pattern"):
        store.add("allow", "not a host")
    (tmp_path / "network.json").write_text("{broken")
    with pytest.raises(InvalidArgument, match="cannot read the user's network list"):
        store.load()


@pytest.mark.usefixtures("data_dir")  # the list lives in the data directory: this test's own
def test_only_an_allowlist_session_takes_the_users_list() -> None:
    UserNetwork().add("allow", "api.test")
    UserNetwork().add("deny", "evil.test")
    allowlist = for_profile(Profile.model_validate({"network": {"mode": "allowlist", "allow": ["pypi.org"]}}))
    assert allowlist.allow == ("pypi.org", "api.test") and allowlist.deny == ("evil.test",)
    none = for_profile(Profile.model_validate({}))
    assert none.allow == () and none.deny == ()
