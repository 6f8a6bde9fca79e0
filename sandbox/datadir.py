"""Where the sandbox keeps its state: audit log, trust store, scratch and copy trees.

``$SANDBOX_DATA_DIR`` wins, then ``$XDG_DATA_HOME/sandbox``, then ``~/.local/share/sandbox``.
"""

from __future__ import annotations

import os
from pathlib import Path

from sandbox.errors import map_errors


def data_dir() -> Path:
    explicit = os.environ.get("SANDBOX_DATA_DIR")
    if explicit:
        base = Path(explicit)
    else:
        xdg = os.environ.get("XDG_DATA_HOME")
        base = Path(xdg) / "sandbox" if xdg else Path.home() / ".local" / "share" / "sandbox"
    with map_errors(f"cannot create the sandbox data directory {base}"):
        base.mkdir(parents=True, exist_ok=True, mode=0o700)
    return base


def subdir(name: str) -> Path:
    path = data_dir() / name
    with map_errors(f"cannot create {path} in the sandbox data directory"):
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path
