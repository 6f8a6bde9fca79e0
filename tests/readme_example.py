"""Run the README's Python example as written, against whatever `sandbox` this interpreter imports.

Usage: python tests/readme_example.py README.md WORKDIR

The example's placeholder project path is replaced by a real project made here: an `app.py`
with `x = 1`, a test, and a `.venv` (made with Debian's /usr/bin/python3, which the jail can see)
holding pytest, so the example's `pytest -q` finds it through the workspace's `.venv/bin`.
Exit 0 only when the example ran pytest in the jail, edited, and rolled the edit back.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

PLACEHOLDER = "/path/to/project"


def example(readme: Path) -> str:
    text = readme.read_text(encoding="utf-8")
    section = text.split("## Quick start", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    if match is None or PLACEHOLDER not in match.group(1):
        sys.exit(f"readme example: no python block naming {PLACEHOLDER} under '## Quick start'")
    return match.group(1)


def make_project(root: Path) -> Path:
    project = root / "project"
    project.mkdir(parents=True, exist_ok=True)
    (project / "app.py").write_text("x = 1\n")
    (project / "test_app.py").write_text("import app\n\ndef test_x():\n    assert app.x == 1\n")
    venv = project / ".venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "pytest"], check=True)
    return project


def main() -> int:
    readme, work = Path(sys.argv[1]), Path(sys.argv[2])
    project = make_project(work)
    code = example(readme).replace(PLACEHOLDER, str(project))
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=work, timeout=300, check=False
    )
    sys.stdout.write(done.stdout)
    sys.stderr.write(done.stderr)
    problems = []
    if done.returncode != 0:
        problems.append(f"exit {done.returncode}")
    if "1 passed" not in done.stdout:
        problems.append("pytest did not pass inside the jail")
    if "True None 0" not in done.stdout:
        problems.append("the Bash result was not ok / exit 0")
    if (project / "app.py").read_text() != "x = 1\n":
        problems.append("the edit was not rolled back")
    if problems:
        sys.stderr.write(f"readme example failed: {'; '.join(problems)}\n")
        return 1
    sys.stdout.write("readme example: ok\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
