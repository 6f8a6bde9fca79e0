"""What the Docker test modules share: the backend (or a skip saying what is missing) and the jails
a test opens, each closed after it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Generic, TypeVar

from sandbox.backends import docker as dockerb
from tests.conftest import backend_or_skip, make_profile

if TYPE_CHECKING:
    from pathlib import Path
    from types import TracebackType

J = TypeVar("J", bound=dockerb.DockerJail)


def docker_or_skip() -> dockerb.DockerBackend:
    found = backend_or_skip("docker")
    assert isinstance(found, dockerb.DockerBackend)
    return found


class Jails(Generic[J]):
    """Opens jails over the test's workspace, each checked to be one of ``kinds``; leaving it closes
    every one opened. (A tuple, as isinstance takes it: mypy refuses an abstract class as ``type[J]``.)"""

    def __init__(self, backend: dockerb.DockerBackend, workspace: Path, kinds: tuple[type[J], ...]) -> None:
        self.backend, self.workspace, self.kinds = backend, workspace, kinds
        self.opened: list[J] = []

    async def open(self, **overrides: Any) -> J:
        """A jail of a shipped profile with dotted-key ``overrides`` (see tests.conftest.make_profile)."""
        jail = await self.backend.open_jail(self.workspace, make_profile(**overrides))
        assert isinstance(jail, self.kinds), jail
        self.opened.append(jail)
        return jail

    async def __aenter__(self) -> Jails[J]:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for jail in self.opened:
            await jail.aclose()
