"""The one exception tree of the sandbox.

Every error that crosses a public call is a :class:`SandboxError` carrying a stable
``code`` (the strings below never change meaning) and structured ``data``::

    SandboxError                      code
    ├── InvalidArgument               INVALID_ARGUMENT       bad input: argv, timeout, profile, path
    ├── ToolDenied                    TOOL_DENIED            unknown tool, policy or user said no
    ├── ToolFailed                    TOOL_FAILED            the tool ran and failed (exit != 0, I/O error)
    ├── Timeout                       TIMEOUT                the deadline passed; the tree was killed
    ├── Aborted                       ABORTED                cancelled by the caller; the tree was killed
    ├── ShellNotFound                 SHELL_NOT_FOUND        no usable shell inside the jail
    ├── BackendUnavailable            BACKEND_UNAVAILABLE    backend missing, daemon gone, jail failed to start
    ├── GuaranteeUnavailable          GUARANTEE_UNAVAILABLE  a profile requires what this host cannot enforce
    ├── Conflict                      CONFLICT               apply/rollback refused: the target changed
    ├── PluginDisabledInPlan          PLUGIN_DISABLED_IN_PLAN  a plugin tool called in plan or goal mode
    ├── CommandShellChanged           COMMAND_SHELL_CHANGED  the turn's pinned shell is not the one a call would run in
    └── CommandShellInvalid           COMMAND_SHELL_INVALID  a shell id unknown, or not of this platform

The codes are :data:`sandbox.vocabulary.ErrorCode`, declared once: each class below names its
own, and the JSON-RPC schema and the pi client derive theirs from that type.

``map_errors`` translates OS-level errors where they cross into our code, so no raw
``OSError`` leaks out of a public call.
"""

from __future__ import annotations

import contextlib
import errno
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

if TYPE_CHECKING:
    from collections.abc import Iterator

    from sandbox.vocabulary import ErrorCode


class SandboxError(Exception):
    """The root: never raised itself; each subclass names its :data:`ErrorCode`."""

    code: ClassVar[ErrorCode]

    def __init__(self, message: str, **data: Any) -> None:
        super().__init__(message)
        self.message = message
        self.data: dict[str, Any] = data

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "data": self.data}

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class InvalidArgument(SandboxError):
    code = "INVALID_ARGUMENT"


class ToolDenied(SandboxError):
    code = "TOOL_DENIED"


class ToolFailed(SandboxError):
    code = "TOOL_FAILED"


class Timeout(SandboxError):
    code = "TIMEOUT"


class Aborted(SandboxError):
    code = "ABORTED"


class ShellNotFound(SandboxError):
    code = "SHELL_NOT_FOUND"


class BackendUnavailable(SandboxError):
    code = "BACKEND_UNAVAILABLE"


class GuaranteeUnavailable(SandboxError):
    code = "GUARANTEE_UNAVAILABLE"


class Conflict(SandboxError):
    code = "CONFLICT"


class PluginDisabledInPlan(SandboxError):
    """Seed 003 §11: no plugin tool runs in a contract mode (plan or goal; the code is shared by both)."""

    code = "PLUGIN_DISABLED_IN_PLAN"


class CommandShellChanged(SandboxError):
    code = "COMMAND_SHELL_CHANGED"


class CommandShellInvalid(SandboxError):
    code = "COMMAND_SHELL_INVALID"


E = TypeVar("E", bound=BaseException)


def find_error(exc: BaseException, kind: type[E]) -> E | None:
    """The first ``kind`` error in ``exc`` or, depth first, in the exception groups around it."""
    if isinstance(exc, kind):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        inner: BaseException
        for inner in exc.exceptions:
            found = find_error(inner, kind)
            if found is not None:
                return found
    return None


@contextlib.contextmanager
def map_errors(what: str, default: type[SandboxError] = ToolFailed) -> Iterator[None]:
    """Translate an ``OSError`` raised inside the block into our tree.

    A full disk keeps its errno in ``data`` so a caller can tell it from other I/O failures.
    """
    try:
        yield
    except SandboxError:
        raise
    except OSError as exc:
        name = errno.errorcode.get(exc.errno or 0, "EUNKNOWN")
        raise default(f"{what}: {exc.strerror or exc}", errno=name, path=exc.filename) from exc
