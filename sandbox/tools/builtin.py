"""The built-in tools by name: what a session dispatches a call to."""

from __future__ import annotations

from types import MappingProxyType
from typing import TYPE_CHECKING

from sandbox.tools.bash import Bash
from sandbox.tools.files import FILE_TOOLS

if TYPE_CHECKING:
    from sandbox.tools.base import Tool

TOOLS: MappingProxyType[str, Tool] = MappingProxyType({tool.name: tool for tool in (Bash(), *FILE_TOOLS)})
