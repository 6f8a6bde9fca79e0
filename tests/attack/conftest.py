"""The attack suite's matrix: every attack class meets every backend x lifecycle x mount mode.

``backend`` (from ``tests/conftest.py``) gives bubblewrap and Docker, each warm (a jail per
session) and per call (``bwrap-call``, ``docker-call``: every module of this package gets those,
see ``PER_CALL_MODULES``); the root run and the ordinary-user run (``tests/run-as-user.sh``) give
the user axis; ``mode`` gives the mount strategies. A new lifecycle or mode added to these
fixtures inherits every attack here. A combination a host cannot give is skipped with the reason.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from sandbox import mounts
from tests.conftest import make_profile

if TYPE_CHECKING:
    from sandbox import profile as profiles
    from sandbox.backends import base

MODES = ("ro", "rw", "copy", "overlay")
WRITABLE_MODES = ("rw", "copy", "overlay")
PRIVATE_MODES = ("copy", "overlay")  # the modes whose changes come back through review and apply


def skip_unless_mode_available(backend: base.Backend, mode: str) -> None:
    """``overlay`` needs a kernel that lets this user mount one (and a local backend's view)."""
    if mode == "overlay":
        why = mounts.overlay_support()
        if why is not None:
            pytest.skip(f"overlay mounts unavailable here: {why}")
        if backend.name != "bwrap":
            pytest.skip(f"the {backend.name} backend has no overlay mount strategy")


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest, backend: base.Backend) -> str:
    skip_unless_mode_available(backend, request.param)
    return str(request.param)


@pytest.fixture(params=WRITABLE_MODES)
def writable_mode(request: pytest.FixtureRequest, backend: base.Backend) -> str:
    skip_unless_mode_available(backend, request.param)
    return str(request.param)


@pytest.fixture(params=PRIVATE_MODES)
def private_mode(request: pytest.FixtureRequest, backend: base.Backend) -> str:
    skip_unless_mode_available(backend, request.param)
    return str(request.param)


def mode_profile(mode: str, /, **overrides: object) -> profiles.Profile:
    """The default profile with the workspace mounted as ``mode``."""
    return make_profile("default", **{"mount.strategy": mode, **overrides})
