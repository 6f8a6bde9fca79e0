"""The pi harness: pi's real agent loop with the sandbox extension against pi's own tools (issue 13 item 3).

A thin wrapper: the benchmark itself is ``integrations/pi/bench/pi-harness.ts``, run with the Node
that the pi extension's tests use (the npm ``node`` package, pi needs >= 22.19) and ``tsx``. One
scripted session of about 40 tool calls (ls, read, write, edit, grep, find, bash) through
``pi --mode rpc`` and a scripted model on loopback, with the extension (``sandbox serve``, the
default profile, its warm bubblewrap jail) and without any extension, interleaved by rounds.
Printed per tool: median sandboxed ms, median ms of pi's own tool, the ratio and whether it meets
the target (<= 2.0x); then the session's wall time and its ratio. A missed target does not fail the
run; a call that fails, or results that differ between the two runs, do.

Skipped, saying what is missing, without Node >= 22.19 and pi (``make node-deps`` then ``npm ci`` in
integrations/pi), bubblewrap, git, or the ripgrep and fd that pi's own grep and find run.

Usage: ``python bench/bench_pi.py [--rounds 3] [--json FILE]``; ``SANDBOX_BIN`` names the sandbox
executable (default: the one beside this interpreter).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PI_DIR = HERE.parent / "integrations" / "pi"
NODE = PI_DIR / "node_modules" / ".bin" / "node"
PI_CLI = PI_DIR / "node_modules" / "@earendil-works" / "pi-coding-agent" / "dist" / "bundle" / "cli.js"
TSX = PI_DIR / "node_modules" / "tsx"
HARNESS = PI_DIR / "bench" / "pi-harness.ts"
NODE_MIN = (22, 19)
INSTALL_PI = "make node-deps, then npm ci in integrations/pi"


def sandbox_bin() -> Path:
    named = os.environ.get("SANDBOX_BIN")
    return Path(named) if named else Path(sys.executable).parent / "sandbox"


def node_version() -> tuple[int, ...] | None:
    try:
        out = subprocess.run([str(NODE), "--version"], capture_output=True, text=True, check=True, timeout=30).stdout
        return tuple(int(part) for part in out.strip().lstrip("v").split(".")[:2])
    except (OSError, ValueError, subprocess.SubprocessError):
        return None


def bwrap_missing() -> str | None:
    sys.path.insert(0, str(HERE.parent))
    from sandbox.backends import base

    report = base.get("bwrap").probe()
    return None if report.available else f"bubblewrap unavailable ({report.reason})"


def missing() -> str | None:
    """What the benchmark lacks on this machine, or None when it can run."""
    version = node_version() if NODE.exists() else None
    if version is None or version < NODE_MIN:
        found = ".".join(map(str, version)) if version else "none"
        return f"Node >= 22.19 at {NODE} (found: {found}): {INSTALL_PI}"
    for path, what in ((PI_CLI, "pi (@earendil-works/pi-coding-agent)"), (TSX, "tsx")):
        if not path.exists():
            return f"{what} under {PI_DIR / 'node_modules'}: {INSTALL_PI}"
    if not os.access(sandbox_bin(), os.X_OK):
        return f"the sandbox executable {sandbox_bin()} (set SANDBOX_BIN)"
    if shutil.which("git") is None:
        return "git (the session's workspace is a repository): apt-get install git"
    if shutil.which("rg") is None or not (shutil.which("fd") or shutil.which("fdfind")):
        return "ripgrep and fd, which pi's own grep and find run: apt-get install ripgrep fd-find"
    return bwrap_missing()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", help="write every call's time here")
    args = parser.parse_args()
    why = missing()
    if why:
        print(f"skipped: missing {why}")
        return 0
    argv = [str(NODE), "--import", "tsx", str(HARNESS), "--rounds", str(args.rounds)]
    if args.json:
        argv += ["--json", str(Path(args.json).resolve())]
    env = {**os.environ, "SANDBOX_BIN": str(sandbox_bin())}
    return subprocess.run(argv, cwd=PI_DIR, env=env, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
