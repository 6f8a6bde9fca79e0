"""A dependency directory cannot smuggle anything back to the host unflagged (issue 32, item 2).

A venv made with plain ``python3 -m venv`` holds ``bin/python3 -> /usr/bin/python3``: a link into
the read-only system tree the jail was given, carried as a link and flagged ``system-link`` (listed,
not consent-worthy: it can only name a host file the user can already run). Everything else a
jail can plant in ``.venv`` is judged as before: a new executable is flagged, a setuid bit is
flagged and never reaches the host, and a link to the host's home, through ``..`` to ``/etc`` or
into ``/proc`` is ``symlink-outside`` and never applied, even when the directory is named in
``--only .venv`` (which applies the directory's content, not its bare entry).
"""

from __future__ import annotations

import base64
import io
import os
import stat
import tarfile
from typing import TYPE_CHECKING

import pytest

from sandbox import changes, mounts
from sandbox.errors import InvalidArgument
from sandbox.session import Sandbox
from tests.attack.conftest import mode_profile

if TYPE_CHECKING:
    from pathlib import Path

    from sandbox.backends import base
    from sandbox.mounts import Change

pytestmark = pytest.mark.anyio

OUTSIDE_LINKS = {
    ".venv/bin/python": "/root/.ssh/id_rsa",
    ".venv/bin/passwd": "../../../../../../../../../../etc/passwd",
    ".venv/bin/environ": "/proc/self/environ",
    ".venv/bin/sysup": "/usr/bin/../../etc/shadow",  # starts in the system tree, leaves it
    ".venv/lib64": "/usr/lib",  # a system directory: a host tool could write through it
}


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


PLANT = " && ".join(
    [
        "mkdir -p .venv/bin",
        "printf '#!/bin/sh\\necho pwned\\n' > .venv/bin/evil && chmod 755 .venv/bin/evil",
        "printf x > .venv/bin/suid && chmod 4755 .venv/bin/suid",
        "ln -s /usr/bin/python3 .venv/bin/python3",  # the honest one
        # the targets hidden from the policy layer, as a jail's own script would have them
        *(f'ln -s "$(echo {_b64(target)} | base64 -d)" {path}' for path, target in OUTSIDE_LINKS.items()),
    ]
)


async def _planted(backend: base.Backend, workspace: Path, mode: str) -> tuple[dict[str, Change], str]:
    box = await Sandbox.create(workspace, profile=mode_profile(mode, backend=backend.name), mode="auto")
    try:
        ran = await box.call("Bash", {"command": PLANT})
        assert ran.ok, ran
        found = {c.path: c for c in (await box.changes()).changes}
    finally:
        await box.aclose()
    assert box.changeset_id is not None
    return found, box.changeset_id


async def test_a_dependency_directory_brings_back_nothing_unflagged(
    backend: base.Backend, workspace: Path, private_mode: str
) -> None:
    found, cid = await _planted(backend, workspace, private_mode)
    assert "new-executable" in found[".venv/bin/evil"].flags
    assert "setuid" in found[".venv/bin/suid"].flags
    honest = found[".venv/bin/python3"]
    assert "system-link" in honest.flags and "symlink-outside" not in honest.flags, honest
    assert honest.applicable, honest
    for path in OUTSIDE_LINKS:
        assert "symlink-outside" in found[path].flags and not found[path].applicable, found[path]
        assert "system-link" not in found[path].flags, found[path]

    report = await changes.load(cid).apply([".venv"])  # naming the directory names its content

    skipped = {s["path"] for s in report.skipped}
    assert set(OUTSIDE_LINKS) <= skipped, report
    for path in OUTSIDE_LINKS:
        assert not os.path.lexists(workspace / path), path
    assert os.readlink(workspace / ".venv/bin/python3") == "/usr/bin/python3"
    assert not os.lstat(workspace / ".venv/bin/suid").st_mode & (stat.S_ISUID | stat.S_ISGID)
    for path in report.applied:  # whatever the host can now run was flagged in the review
        st = os.lstat(workspace / path)
        if (stat.S_ISREG(st.st_mode) and st.st_mode & 0o111) or stat.S_ISLNK(st.st_mode):
            assert found[path].flags, (path, found[path])


async def test_only_a_directory_applies_its_content_or_refuses(
    backend: base.Backend, workspace: Path, private_mode: str
) -> None:
    _found, cid = await _planted(backend, workspace, private_mode)
    report = await changes.load(cid).apply([".venv/bin/"])
    assert ".venv/bin/evil" in report.applied and ".venv/bin/python3" in report.applied, report
    assert (workspace / ".venv/bin/evil").read_text() == "#!/bin/sh\necho pwned\n"
    with pytest.raises(InvalidArgument, match="not in changeset"):
        await changes.load(cid).apply([".venv/nothing-here"])


@pytest.mark.parametrize(
    ("target", "verdict"),
    [
        ("/usr/bin/python3", "system"),
        ("python3", "inside"),
        ("../../../../../../../../../../usr/bin/python3", "system"),
        ("/usr/local/bin/python3-absent-here", "system"),
        ("/usr/bin", "outside"),  # a directory: writes through it would land in the host's system tree
        ("/usr/bin/../../etc/shadow", "outside"),
        ("/usr/nothing/../../etc/passwd", "outside"),
        ("/etc/passwd", "outside"),
        ("/proc/self/root/usr/bin/python3", "outside"),  # a magic link: the reader's root, not ours
        ("/proc/self/exe", "outside"),
        ("/root/.ssh/id_rsa", "outside"),
    ],
)
def test_which_link_targets_count_as_the_system_tree(tmp_path: Path, target: str, verdict: str) -> None:
    ws = tmp_path / "ws"
    (ws / ".venv" / "bin").mkdir(parents=True)
    assert mounts.link_verdict(".venv/bin/python", target, ws) == verdict


def test_the_system_tree_is_what_bubblewrap_binds() -> None:
    from sandbox.backends import bwrap_argv

    assert set(mounts.SYSTEM_TREES) == set(bwrap_argv.SYSTEM_DIRS)


def test_a_system_link_alone_needs_no_consent_but_is_listed() -> None:
    link = mounts.Change("bin/python3", "added", "symlink", ["system-link"], target="/usr/bin/python3")
    dotted = mounts.Change(".venv/bin/python3", "added", "symlink", ["dotfile", "system-link"])
    assert not mounts.needs_consent(link, None, include_flagged=False)
    assert mounts.needs_consent(dotted, None, include_flagged=False)
    assert mounts.Changeset([link, dotted]).risky == [dotted]


def _tar(*links: tuple[str, str]) -> list[bytes]:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in ("ws", "ws/.venv", "ws/.venv/bin"):
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for name, target in links:
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    return [out.getvalue()]


def test_a_remote_engines_system_link_is_made_here_and_judged_by_this_host(tmp_path: Path) -> None:
    """A remote engine's copy-out (the jail's word as a tar stream): a link naming the image's system
    tree is made in the private copy, then judged as a local copy's; one that leaves is held back."""
    from sandbox.backends.docker.archive import sync_from_tar

    host_ws, root = tmp_path / "ws", tmp_path / "copy"
    host_ws.mkdir()
    root.mkdir()
    links = {
        "python3": "/usr/bin/python3",
        "py": "/usr/local/bin/python3-absent-here",  # the image's interpreter, not this host's
        "up": "../../../../../../../etc/passwd",
        "sneak": "/usr/../etc/shadow",
    }
    sync = sync_from_tar(_tar(*((f"ws/.venv/bin/{n}", t) for n, t in links.items())), root, "/work/ws")
    assert {h.rel for h in sync.held} == {".venv/bin/up", ".venv/bin/sneak"}
    assert os.readlink(root / ".venv/bin/python3") == "/usr/bin/python3"
    found = {c.path: c for c in mounts.CopyTree(host_ws, root)._changes().changes}
    assert "system-link" in found[".venv/bin/python3"].flags and not found[".venv/bin/python3"].note
    absent = found[".venv/bin/py"]
    assert "system-link" in absent.flags and absent.applicable, absent
    assert absent.note == "points to /usr/local/bin/python3-absent-here, which this host does not have"
