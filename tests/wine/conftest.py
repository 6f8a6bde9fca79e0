"""Fixtures of the Windows suite: a winjob jail over a temporary workspace, under a profile
the backend can honour (network host: it does not cut the network; tree-kill required)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from sandbox.backends.base import Jail
    from sandbox.profile import Profile

if sys.platform != "win32":
    collect_ignore_glob = ["test_*.py"]


PROFILE_TOML = """\
description = "Windows job objects: tree kill and scrubbed environment; the caller's network."
backend = "winjob"
requires = ["tree-kill", "env-scrubbed"]

[network]
mode = "host"

[timeouts]
default_s = 60
max_s = 600
"""


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def profile(tmp_path: Path) -> Profile:
    from sandbox import profile as profiles

    path = tmp_path / "windows.toml"
    path.write_text(PROFILE_TOML)
    return profiles.load_file(path)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    return ws


@pytest.fixture
async def jail(workspace: Path, profile: Profile) -> AsyncIterator[Jail]:
    from sandbox.backends import base

    async with await base.get("winjob").open_jail(workspace, profile) as opened:
        yield opened
