"""The seal searched again before each call (issue 31, category 5), against today's once-per-jail seal.

A warm jail (bubblewrap, then Docker when it is there) on a workspace of ``BENCH_RESEAL_DIRS``
(1,000) directories of 20 files each; per row the median of ``BENCH_RESEAL_CALLS`` (30) calls of
``true``, interleaved so that a noisy neighbour slows them alike:

* ``search``: the check alone (:meth:`sandbox.backends.seal.Watch.changed`, nothing moved);
* ``call, checked``: a call as it runs now, the search before it;
* ``call, unchecked``: the same jail with the check turned off (the seal of the jail's start only,
  as before);
* ``call after a new secret``: a secret created on the host before each call: the search, the
  rebuild and a new warm jail sealed anew (the price only a change pays).

Exit 1 when a call after a new secret could read it (a faster jail that leaks is no speed-up).
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

from sandbox import exec as executor
from sandbox.backends import base
from sandbox.errors import SandboxError
from sandbox.profile import Profile

DIRS = int(os.environ.get("BENCH_RESEAL_DIRS", "1000"))
CALLS = int(os.environ.get("BENCH_RESEAL_CALLS", "30"))
SECRET = "bench-reseal-secret"


def _workspace(owner: int | None) -> Path:
    root = Path(tempfile.mkdtemp(prefix="sandbox-bench-reseal-"))
    for d in range(DIRS):
        folder = root / f"a{d // 20:03d}" / f"b{d:04d}"
        folder.mkdir(parents=True)
        for f in range(20):
            (folder / f"f{f}.py").write_text("x = 1\n")
    if owner is not None:  # Docker runs commands as the workspace's owner, never root
        for path in (root, *root.rglob("*")):
            os.chown(path, owner, owner)
    time.sleep(2.5)  # past the racy window: the cache trusts every directory
    return root


async def _call(jail: base.Jail, argv: list[str]) -> tuple[float, str]:
    started = time.perf_counter()
    result = await executor.run(jail, argv, timeout=60)
    return (time.perf_counter() - started) * 1000, result.stdout


async def _rows(name: str, workspace: Path) -> bool:
    profile = Profile().with_overrides(**{"backend": name, "mount.strategy": "rw", "requires": ()})
    async with await base.get(name).open_jail(workspace, profile) as jail:
        for _ in range(3):
            await _call(jail, ["true"])
        watch: Any = jail._watch  # type: ignore[attr-defined]
        real = type(jail)._resealed  # type: ignore[attr-defined]

        async def unchecked(_jail: object) -> bool:
            return False

        search, checked, plain = [], [], []
        for _ in range(CALLS):
            started = time.perf_counter()
            watch.changed()
            search.append((time.perf_counter() - started) * 1000)
            checked.append((await _call(jail, ["true"]))[0])
            type(jail)._resealed = unchecked  # type: ignore[attr-defined]
            try:
                plain.append((await _call(jail, ["true"]))[0])
            finally:
                type(jail)._resealed = real  # type: ignore[attr-defined]
        changed, leaked = [], False
        for i in range(5):
            (workspace / "a000" / "b0000" / f"new{i}.pem").write_text(SECRET)
            took, out = await _call(jail, ["cat", f"a000/b0000/new{i}.pem"])
            changed.append(took)
            leaked |= SECRET in out
    print(f"{name}, {DIRS} directories, {DIRS * 20} files (medians, ms):")
    print(f"  search, nothing moved      {statistics.median(search):8.2f}")
    print(f"  call, checked              {statistics.median(checked):8.2f}")
    print(f"  call, unchecked (before)   {statistics.median(plain):8.2f}")
    print(f"  call after a new secret    {statistics.median(changed):8.2f}  (a new jail sealed anew)")
    if leaked:
        print("  LEAK: a call read a secret created before it")
    return not leaked


async def main() -> int:
    ok = True
    for name in ("bwrap", "docker"):
        owner = 1000 if name == "docker" and os.geteuid() == 0 else None
        try:
            ok &= await _rows(name, _workspace(owner))
        except SandboxError as exc:
            print(f"{name}: skipped ({exc.message})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(anyio.run(main))
