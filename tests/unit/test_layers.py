"""The fences between the package's layers, read statically from the source.

Every import counts: at module level, inside a function, or under ``TYPE_CHECKING`` (a type-only
import still ties one layer to another). Relative imports are resolved against the importing
module. A failure names the module, the line and the import that crosses the fence.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

import sandbox

if TYPE_CHECKING:
    from collections.abc import Iterator

PACKAGE = Path(sandbox.__file__).parent
JAILSIDE = "sandbox._jailside"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules(package: str) -> list[Path]:
    root = PACKAGE.parent.joinpath(*package.split("."))
    return sorted(root.rglob("*.py")) if root.is_dir() else [root.with_suffix(".py")]


def _imports(path: Path) -> Iterator[tuple[int, str]]:
    """``(line, name)`` for each name imported; ``from a import b`` yields ``a.b``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(path, node)
            for alias in node.names:
                yield node.lineno, f"{base}.{alias.name}"


def _absolute(path: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = _module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    anchor = package[: len(package) - (node.level - 1)]
    return ".".join([*anchor, node.module] if node.module else anchor)


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def _crossings(package: str, forbidden: tuple[str, ...]) -> list[str]:
    return sorted(
        {
            f"{_module_name(path)} (line {line}) imports {name}"
            for path in _modules(package)
            for line, name in _imports(path)
            if any(_within(name, other) for other in forbidden)
        }
    )


def test_jailside_code_imports_only_the_standard_library() -> None:
    found = sorted(
        f"{_module_name(path)} (line {line}) imports {name}, which is not in the standard library"
        for path in _modules(JAILSIDE)
        for line, name in _imports(path)
        if not _within(name, JAILSIDE) and name.split(".")[0] not in sys.stdlib_module_names
    )
    assert found == []


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [
        ("sandbox.policy", ("sandbox.backends",)),
        ("sandbox.backends", ("sandbox.session", "sandbox.server", "sandbox.tools")),
    ],
)
def test_a_layer_imports_nothing_from_the_layers_above_it(package: str, forbidden: tuple[str, ...]) -> None:
    assert _crossings(package, forbidden) == []


def test_the_fences_see_relative_and_type_only_imports() -> None:
    # The checks above pass vacuously if the walker misses imports; make sure it does not.
    names = {name for _, name in _imports(PACKAGE / "_jailside" / "runner.py")}
    assert {"sandbox._jailside.glob.glob_regex", "collections.abc.Callable"} <= names
    node = ast.parse("from ..backends import base").body[0]
    assert isinstance(node, ast.ImportFrom)
    assert _absolute(PACKAGE / "policy" / "gate.py", node) == "sandbox.backends"
    assert _absolute(PACKAGE / "policy" / "__init__.py", node) == "sandbox.backends"
