"""SHELL_NOT_FOUND on Unix: an image without bash refuses the Bash tool with that code, never
another shell in its place, and the file tools still work (they need no shell).

The image is the runtime image with bash removed, built here from the local one (no registry).
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

import pytest

from sandbox import Sandbox
from sandbox.backends import docker as dockerb
from sandbox.backends.docker.client import connect
from tests.conftest import make_profile, own_like_a_checkout
from tests.integration._docker import docker_or_skip

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

pytestmark = [pytest.mark.anyio, pytest.mark.docker]

NO_BASH_IMAGE = "sandbox-test:no-bash"


@pytest.fixture(scope="module")
def no_bash_image() -> Iterator[str]:
    docker_or_skip()
    client = connect()
    recipe = f"FROM {dockerb.DEFAULT_IMAGE}\nUSER root\nRUN rm -f /bin/bash /usr/bin/bash /usr/local/bin/bash\n"
    client.images.build(fileobj=io.BytesIO(recipe.encode()), tag=NO_BASH_IMAGE, rm=True, network_mode="none")
    try:
        yield NO_BASH_IMAGE
    finally:
        client.images.remove(NO_BASH_IMAGE, force=True)
        client.close()


@pytest.mark.parametrize("lifecycle", ["session", "call"])
async def test_no_bash_in_the_image_is_shell_not_found(no_bash_image: str, workspace: Path, lifecycle: str) -> None:
    own_like_a_checkout(workspace)
    profile = make_profile(backend="docker", **{"docker.image": no_bash_image, "docker.lifecycle": lifecycle})
    async with Sandbox.open(workspace, profile=profile, mode="auto") as s:
        bash = await s.call("Bash", {"command": "echo ran > ran.txt"})
        read = await s.call("Read", {"path": "README.md"})
    assert (bash.ok, bash.error_code) == (False, "SHELL_NOT_FOUND"), bash
    assert "bash is not installed in the jail" in bash.content
    assert not (workspace / "ran.txt").exists()  # no other shell ran it
    assert read.ok and "# sample" in read.content
