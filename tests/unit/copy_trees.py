"""A private copy of a small workspace, prepared as a copy-mount jail would get it (no jail needed)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sandbox.mounts import CopyTree

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path


async def copy_of(tmp_path: Path, files: Mapping[str, str | bytes]) -> CopyTree:
    """``files`` (relative path: text or bytes) written under ``tmp_path/ws``, then copied in."""
    ws = tmp_path / "ws"
    for rel, content in files.items():
        path = ws / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    (tmp_path / "copies").mkdir()
    return await CopyTree.prepare(ws, tmp_path / "copies")
