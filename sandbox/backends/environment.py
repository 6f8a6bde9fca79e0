"""The scrubbed environment a jailed command sees: an allowlist, never the caller's secrets."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping

    from sandbox.profile import Profile

SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SANDBOX_HOME = "/tmp/home"
SANDBOX_UID = 1000
SANDBOX_GID = 1000
PASSTHROUGH = ("LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "LC_MESSAGES", "TERM", "TZ", "COLORTERM", "NO_COLOR")


def base_env(profile: Profile, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Fixed values, allowlisted names copied from our environment, then the profile's and caller's."""
    env = {
        "PATH": SAFE_PATH,
        "HOME": SANDBOX_HOME,
        "USER": "sandbox",
        "LOGNAME": "sandbox",
        "SHELL": "/bin/sh",
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "SANDBOX": "1",
        "TMPDIR": "/tmp",
    }
    for name in (*PASSTHROUGH, *profile.env.allow):
        value = os.environ.get(name)
        if value is not None:
            env[name] = value
    env.update(profile.env.set)
    env.update(extra or {})
    return env
