"""An OS-level sandboxed executor for AI agents' tools.

The names a library user needs are here, each imported only when first used, so ``import
sandbox`` (and the ``sandbox`` command, which starts from this package) pays for none of them::

    from sandbox import CallbackApprover, Sandbox

    async with Sandbox.open("/path/to/project", approver=CallbackApprover(ask)) as session:
        result = await session.call("Bash", {"command": "pytest -q"})
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sandbox.faces import lazy

__version__ = "0.1.0"

if TYPE_CHECKING:
    from sandbox.errors import SandboxError
    from sandbox.policy.approvals import (
        ApprovalRequest,
        Approver,
        CallbackApprover,
        TerminalApprover,
        UnattendedApprover,
    )
    from sandbox.profile import Profile
    from sandbox.session import Sandbox, SessionOptions
    from sandbox.tools.run import ToolResult

_HOME: dict[str, str] = {
    "ApprovalRequest": "sandbox.policy.approvals",
    "Approver": "sandbox.policy.approvals",
    "CallbackApprover": "sandbox.policy.approvals",
    "Profile": "sandbox.profile",
    "Sandbox": "sandbox.session",
    "SandboxError": "sandbox.errors",
    "SessionOptions": "sandbox.session",
    "TerminalApprover": "sandbox.policy.approvals",
    "ToolResult": "sandbox.tools.run",
    "UnattendedApprover": "sandbox.policy.approvals",
}

__all__ = [
    "ApprovalRequest",
    "Approver",
    "CallbackApprover",
    "Profile",
    "Sandbox",
    "SandboxError",
    "SessionOptions",
    "TerminalApprover",
    "ToolResult",
    "UnattendedApprover",
    "__version__",
]

__getattr__, __dir__ = lazy(__name__, _HOME, globals())
