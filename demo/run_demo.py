"""`make demo`: an untrusted agent task, run unattended in a bubblewrap jail (the default).

The task (demo/task.sh) does useful work on a copy of a sample project and also tries harmful
things. The demo prints what ran, checks on the host what was stopped, shows the changeset for
review and applies only the changes nobody needs to look at twice.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

import anyio
import psutil

from sandbox import changes as changesets
from sandbox import exec as executor
from sandbox import profile as profiles
from sandbox.backends import base

HERE = Path(__file__).resolve().parent
SHOW_BYTES = 6000


def _digest(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None


class Shown:
    """Echo the task's output as it streams, up to a display budget (the flood is not printed)."""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.shown = 0
        self.cut = False

    def __call__(self, chunk: bytes) -> None:
        room = SHOW_BYTES - self.shown
        if room <= 0:
            if not self.cut:
                self.cut = True
                print(f"\n   [{self.tag}: display stops here; the jail keeps counting and capturing]")
            return
        text = chunk[:room].decode(errors="replace")
        self.shown += len(chunk[:room])
        lines = (line if len(line) <= 100 else f"{line[:100]}... ({len(line)} chars)" for line in text.splitlines())
        sys.stdout.write("".join(f"   {self.tag}| {line}\n" for line in lines))
        sys.stdout.flush()


def _daemons() -> list[int]:
    return [
        p.pid
        for p in psutil.process_iter(["cmdline"])
        if "while :; do sleep 1; done" in " ".join(p.info["cmdline"] or [])
    ]


async def main() -> int:
    root = Path(tempfile.mkdtemp(prefix="sandbox-demo-"))
    os.environ["SANDBOX_DATA_DIR"] = str(root / "data")
    project, outside = root / "project", root / "outside"
    shutil.copytree(HERE / "sample_project", project)
    shutil.copy(HERE / "task.sh", project / "agent_task.sh")
    outside.mkdir()
    (outside / "important.txt").write_text("do not delete\n")
    os.environ["GITHUB_TOKEN"] = "ghp_demo_secret_value"
    bashrc = Path.home() / ".bashrc"
    bashrc_before = _digest(bashrc)
    before = {p: _digest(p) for p in project.rglob("*") if p.is_file()}

    prof = profiles.load("untrusted")
    backend = base.choose("auto", prof)
    print(f"profile: untrusted ({prof.description})")
    print(
        f"backend: {backend.name} (auto)  mount: {prof.mount.strategy}  network: {prof.network.mode}  "
        f"memory: {prof.limits.memory} B  pids: {prof.limits.pids}"
    )
    print(f"workspace: {project}\n\n-- the task runs, unattended --")
    async with await backend.open_jail(project, prof) as jail:
        result = await executor.run(
            jail,
            ["bash", "agent_task.sh"],
            timeout=60,
            on_stdout=Shown("out"),
            on_stderr=Shown("err"),
            env={"SANDBOX_DEMO_OUTSIDE": str(outside), "PYTHONDONTWRITEBYTECODE": "1"},
        )
        changes = await jail.changes()
        assert changes is not None
        daemons_after = _daemons()
        verdicts = [
            ("file outside the workspace survived", (outside / "important.txt").exists()),
            ("host ~/.bashrc untouched", _digest(bashrc) == bashrc_before),
            (
                "no network connection or DNS answer",
                "CONNECTED" not in result.stdout and "RESOLVED" not in result.stdout,
            ),
            ("caller's GITHUB_TOKEN never reached the task", "ghp_demo" not in result.stdout + result.stderr),
            ("/etc/shadow unreadable", "root:" not in result.stdout),
            ("daemon killed when the task ended", not daemons_after),
            (
                f"output flood bounded ({result.stdout_bytes:,} B produced, {len(result.stdout):,} B kept)",
                result.stdout_truncated,
            ),
            ("system directories read-only", Path("/usr/share/doc").exists()),
            (
                "host workspace unchanged before review",
                {p: _digest(p) for p in project.rglob("*") if p.is_file()} == before,
            ),
        ]
        print(f"\n-- exit code {result.exit_code} after {result.duration_ms:.0f} ms --\n\nwhat was stopped:")
        for text, ok in verdicts:
            print(f"  [{'ok' if ok else 'FAILED'}] {text}")
        assert jail.tree is not None
        kept = await changesets.keep(jail.tree, changes, source="run", profile="untrusted", backend=backend.name)
        print(f"\nthe changeset is kept as {kept.id} until applied or discarded (sandbox changes show {kept.id}):")
        for change in changes.changes:
            flags = f"  <- {', '.join(change.flags)}" if change.flags else ""
            print(f"  {change.status:9} {change.path}{flags}")
    review = kept.diff()
    print(f"\n-- the review (sandbox changes show {kept.id}), first lines --")
    print("\n".join(f"  {line}" for line in review.splitlines()[:24]))
    report = await kept.apply()  # what `sandbox changes apply ID` does: flagged entries need consent
    print(f"\napplied as one unit (the unflagged entries): {', '.join(report.applied) or 'none'}")
    held = ", ".join(f"{h['path']} [{', '.join(h['flags'])}]" for h in report.held_back)
    print(f"held back until a human names them or passes --include-flagged: {held or 'none'}")
    held_back = ("flagged entries held back (git hook, .envrc)", not (project / ".envrc").exists())
    verdicts.append(held_back)
    print(f"  [{'ok' if held_back[1] else 'FAILED'}] {held_back[0]}")
    shutil.rmtree(root, ignore_errors=True)
    failed = [text for text, ok in verdicts if not ok]
    if failed:
        print(f"\nDEMO FAILED: {failed}")
        return 1
    print("\ndemo ok: the task did its work; every harmful attempt was contained")
    return 0


if __name__ == "__main__":
    sys.exit(anyio.run(main))
