"""Helpers for tests on the fake backend: a profile, a jail opened through the template, and the
``sandbox serve`` client the integration tests use too (:mod:`tests.rpc_client`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sandbox import profile as profiles
from sandbox.backends.fake import FakeBackend, FakeJail, FakeProcess
from tests.rpc_client import Client, serve

if TYPE_CHECKING:
    from pathlib import Path

__all__ = ["Client", "fake_profile", "only_process", "open_fake", "serve"]


def fake_profile(name: str = "default", **overrides: Any) -> profiles.Profile:
    """A shipped profile with dotted-key overrides, as is: a jail opened by hand needs no backend named."""
    return profiles.load(name).with_overrides(**overrides)


async def open_fake(backend: FakeBackend, workspace: Path, **overrides: Any) -> FakeJail:
    """A fake jail over ``workspace`` opened through the backend's template (checks included)."""
    jail = await backend.open_jail(workspace, fake_profile(**overrides))
    assert isinstance(jail, FakeJail)
    return jail


def only_process(jail: FakeJail) -> FakeProcess:
    assert len(jail.processes) == 1, jail.processes
    return jail.processes[0]
