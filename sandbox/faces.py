"""A package's face that imports each name it offers only when the name is first used.

``__getattr__, __dir__ = lazy(__name__, {"Name": "package.module", ...}, globals())`` in a
package's ``__init__``: ``from package import Name`` then imports ``package.module`` at that
moment, and ``Name`` becomes an ordinary attribute of the package. The package also imports the
names under ``TYPE_CHECKING``, for type checkers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, MutableMapping


def lazy(
    package: str, homes: Mapping[str, str], namespace: MutableMapping[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``, whose names live in ``homes`` (name ->
    the module that defines it); ``namespace`` is the package's ``globals()``."""

    def getattr_(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name)
        namespace[name] = value  # once found, an ordinary attribute
        return value

    def dir_() -> list[str]:
        return sorted([*namespace, *homes])

    return getattr_, dir_
