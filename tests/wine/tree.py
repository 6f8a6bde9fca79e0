"""A process tree that tries every way out of a job: run inside a call by the Windows suite.

``python tree.py MARKER PIDFILE``: starts a child with each of DETACHED_PROCESS,
CREATE_NEW_PROCESS_GROUP, CREATE_NEW_CONSOLE, none (which starts a grandchild: nested), and one
asking for CREATE_BREAKAWAY_FROM_JOB (refused: recorded as ``breakaway-refused <winerror>``);
each sleeps with MARKER on its command line (the Linux side finds them with ``ps``). Writes the
pids to PIDFILE, prints ``ready`` and sleeps.
"""

import subprocess
import sys
import time
from pathlib import Path

DETACHED_PROCESS = 0x8
CREATE_NEW_PROCESS_GROUP = 0x200
CREATE_NEW_CONSOLE = 0x10
CREATE_BREAKAWAY_FROM_JOB = 0x01000000


def sleeper(marker: str, nested: bool = False) -> list[str]:
    code = "import time; time.sleep(600)"
    if nested:
        code = (
            "import subprocess, sys, time; "
            f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', '{marker}-grandchild']); "
            "open(sys.argv[2], 'a').write(f'{p.pid}\\n'); time.sleep(600)"
        )
    return [sys.executable, "-c", code, marker]


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main() -> None:
    marker, pidfile = sys.argv[1], sys.argv[2]
    flags = (DETACHED_PROCESS, CREATE_NEW_PROCESS_GROUP, CREATE_NEW_CONSOLE)
    pids = [subprocess.Popen(sleeper(marker), creationflags=flag).pid for flag in flags]
    pids.append(subprocess.Popen([*sleeper(marker, nested=True), pidfile]).pid)
    try:
        subprocess.Popen(sleeper(marker), creationflags=CREATE_BREAKAWAY_FROM_JOB)
        say("breakaway-allowed")
    except OSError as exc:
        say(f"breakaway-refused {getattr(exc, 'winerror', None)}")
    with open(pidfile, "a") as f:
        f.writelines(f"{pid}\n" for pid in pids)
    deadline = time.monotonic() + 60  # the nested child writes its grandchild's pid: wait for it (a loaded host)
    while len(Path(pidfile).read_text().split()) < 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    say("ready")
    time.sleep(600)


if __name__ == "__main__":
    main()
