"""The ``sandbox`` command as the CLI tests run it: the installed console script beside this Python,
never the pytest process's stdin, a bounded wait, and the command line of a jailed shell script."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

SANDBOX = str(Path(sys.executable).with_name("sandbox"))


def sandbox(*args: str, **kwargs: Any) -> subprocess.CompletedProcess[Any]:
    """``sandbox ARGS`` to completion, output captured; ``kwargs`` go to :func:`subprocess.run`.

    stdin is /dev/null unless ``input`` or ``stdin`` is given: the pytest process's own stdin must
    not leak into the command.
    """
    if kwargs.get("input") is None:
        kwargs.setdefault("stdin", subprocess.DEVNULL)
    if "stdout" not in kwargs and "stderr" not in kwargs:
        kwargs.setdefault("capture_output", True)
    kwargs.setdefault("timeout", 120)
    kwargs.setdefault("env", os.environ.copy())
    return subprocess.run([SANDBOX, *args], check=False, **kwargs)


def shell(workspace: Path, script: str) -> list[str]:
    """``--workspace WORKSPACE -- sh -c SCRIPT``: a shell script run in ``workspace``'s jail."""
    return ["--workspace", str(workspace), "--", "sh", "-c", script]
