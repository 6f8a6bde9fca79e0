"""The sealing's cached search (sandbox/backends/seal.py, its records kept by seal_cache.py), tested
by attack: a secret created, renamed into place or removed after a cached search is judged right by
the next one; a directory changed too recently to judge is listed again; a cache file that is
corrupt, partial, forged where others could write it, or kept inside the workspace is ignored,
never an error; workspaces and glob lists do not share a cache; another process reuses the disk
cache.

Each test counts the directories a search *lists*, so that a test where the cache did no work
(every directory listed again) fails instead of passing for the wrong reason.
"""

from __future__ import annotations

import json
import marshal
import os
import subprocess
import sys
import time
import zlib
from typing import TYPE_CHECKING, Any

import pytest

from sandbox.backends import seal, seal_cache
from sandbox.patterns import DEFAULT_DENY_READ

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

RACY_NS = 50_000_000  # tests shrink the racy window so that their directories age in 0.1 s, not 2 s
AGE_S = 0.12


@pytest.fixture(autouse=True)
def fresh_memory() -> Iterator[None]:
    seal_cache.CACHE.clear()
    yield
    seal_cache.CACHE.clear()


@pytest.fixture
def listed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The workspace-relative directories each search lists (not those it reuses)."""
    found: list[str] = []
    listing = seal._Search.list

    def counting(self: seal._Search, path: str, rel: str) -> seal_cache.DirRecord | None:
        found.append(rel)
        return listing(self, path, rel)

    monkeypatch.setattr(seal._Search, "list", counting)
    return found


@pytest.fixture
def ws(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project of a few levels, old enough (under the tests' racy window) to be trusted."""
    root = tmp_path / "ws"
    for rel in ("src/pkg/deep/deeper", "docs", "node_modules/pkg"):
        (root / rel).mkdir(parents=True)
    (root / "src" / "app.py").write_text("x")
    (root / "src" / "pkg" / "deep" / "deeper" / "mod.py").write_text("x")
    (root / ".env").write_text("SECRET=1\n")
    (root / "node_modules" / "pkg" / "ca.pem").write_text("public\n")
    if os.stat(root).st_dev not in seal._trusted_devices():
        pytest.skip("the temp dir's file system is not one the cache trusts (see seal.TRUSTED_FILE_SYSTEMS)")
    monkeypatch.setattr(seal, "RACY_NS", RACY_NS)
    age()
    return root


def age() -> None:
    time.sleep(AGE_S)


def warm(ws: Path, listed: list[str], deny_read: tuple[str, ...] = ()) -> seal.Seal:
    """A first search (every directory listed), then a second that lists none: the cache holds."""
    first = seal.find(ws, deny_read)
    assert sorted(listed) == ["", "docs", "src", "src/pkg", "src/pkg/deep", "src/pkg/deep/deeper"]
    listed.clear()
    assert seal.find(ws, deny_read) == first and listed == []
    return first


def kept_file(ws: Path, deny_read: tuple[str, ...] = ()) -> Path:
    every = (*DEFAULT_DENY_READ, *deny_read)
    real = os.path.realpath(ws)
    key = json.dumps([seal_cache.CACHE_FORMAT, seal_cache.code_version(), real, os.fspath(ws), every])
    path = seal_cache.cache_file(key, real)
    assert path is not None
    return path


def test_a_warm_search_lists_nothing_and_finds_the_same(ws: Path, listed: list[str]) -> None:
    assert warm(ws, listed).masked == ((".env", False),)


CREATE: dict[str, tuple[str, Callable[[Path], object]]] = {
    "file": ("docs/server.key", lambda ws: (ws / "docs" / "server.key").write_text("k")),
    "directory": (".env.d", lambda ws: (ws / ".env.d").mkdir()),
    "in a new sub-directory": ("docs/new/id_rsa", lambda ws: _new_dir_with_key(ws)),
    "by rename into place": ("src/pkg/prod.pem", lambda ws: _renamed_in(ws)),
    "in a deep existing directory": (
        "src/pkg/deep/deeper/.env.local",
        lambda ws: (ws / "src/pkg/deep/deeper/.env.local").write_text("S=1"),
    ),
}


def _new_dir_with_key(ws: Path) -> None:
    (ws / "docs" / "new").mkdir()
    (ws / "docs" / "new" / "id_rsa").write_text("k")


def _renamed_in(ws: Path) -> None:
    (ws / "src" / "pkg" / "draft.txt").write_text("k")
    os.rename(ws / "src" / "pkg" / "draft.txt", ws / "src" / "pkg" / "prod.pem")


@pytest.mark.parametrize("how", list(CREATE))
def test_a_secret_created_after_a_cached_search_is_masked(ws: Path, listed: list[str], how: str) -> None:
    rel, create = CREATE[how]
    warm(ws, listed)
    create(ws)
    found = seal.find(ws)
    assert rel in found.masked_paths, found
    assert len(listed) <= 2, listed  # the changed directory (and a new one): not the whole tree


def test_a_secret_created_after_the_directory_aged_is_masked_too(ws: Path, listed: list[str]) -> None:
    warm(ws, listed)
    (ws / "docs" / "id_ed25519").write_text("k")
    seal.find(ws)
    age()  # now the changed directory is trusted again: the next change must still move its times
    listed.clear()
    assert seal.find(ws).masked_paths == (".env", "docs/id_ed25519") and listed == ["docs"]
    (ws / "docs" / "id_ed25519").rename(ws / "docs" / "id_dsa")
    assert seal.find(ws).masked_paths == (".env", "docs/id_dsa")


def test_a_removed_secret_disappears(ws: Path, listed: list[str]) -> None:
    (ws / "src" / "pkg" / "deep" / "ca.key").write_text("k")
    age()
    assert "src/pkg/deep/ca.key" in seal.find(ws).masked_paths
    listed.clear()
    (ws / "src" / "pkg" / "deep" / "ca.key").unlink()
    (ws / ".env").unlink()
    assert seal.find(ws).masked == ()
    assert sorted(listed) == ["", "src/pkg/deep"]


def test_a_file_replaced_by_a_directory_is_masked_as_one(ws: Path, listed: list[str]) -> None:
    warm(ws, listed)
    (ws / ".env").unlink()
    (ws / ".env").mkdir()
    assert seal.find(ws).masked == ((".env", True),)


def test_a_directory_replaced_by_a_symlink_is_not_entered(ws: Path, tmp_path: Path) -> None:
    (ws / "docs" / "db.key").write_text("k")
    age()
    warm_found = seal.find(ws)
    assert "docs/db.key" in warm_found.masked_paths
    os.rename(ws / "docs", tmp_path / "docs-away")
    (ws / "docs").symlink_to(tmp_path / "docs-away")
    assert seal.find(ws).masked_paths == (".env",)  # as without a cache: a symlink is never followed


def test_a_racy_directory_is_listed_again(ws: Path, listed: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A directory whose times are within the racy window is never trusted, even when they did not
    move: the cache's record (forged here to leave out ``.env``) is not used."""
    monkeypatch.setattr(seal, "RACY_NS", 3600 * 10**9)  # everything here is "too recent"
    seal.find(ws)
    listed.clear()
    assert seal.find(ws).masked_paths == (".env",)
    assert len(listed) == 6  # all listed again
    key, tree = _only_tree()
    assert not any(d.trusted for d in tree.values())
    seal_cache.CACHE.remember(key, {**tree, "": tree[""]._replace(masked=(), trusted=False)})
    assert seal.find(ws).masked_paths == (".env",)
    # The same forgery marked trusted would be believed: what the racy flag is for.
    seal_cache.CACHE.remember(key, {**tree, "": tree[""]._replace(masked=(), trusted=True)})
    assert seal.find(ws).masked_paths == ()


def test_an_untrusted_file_system_is_always_walked(
    ws: Path, listed: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(seal, "_trusted_devices", frozenset)  # as with NFS, FUSE or no /proc
    seal.find(ws)
    listed.clear()
    assert seal.find(ws).masked_paths == (".env",) and len(listed) == 6


def test_a_device_no_longer_trusted_is_walked(ws: Path, listed: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Trusted when kept, then remounted as a file system the cache does not trust: listed again."""
    warm(ws, listed)
    monkeypatch.setattr(seal, "_trusted_devices", frozenset)
    assert seal.find(ws).masked_paths == (".env",) and len(listed) == 6


def test_a_directory_mtime_put_back_does_not_hide_a_secret(ws: Path, listed: list[str]) -> None:
    """``touch -d``: a command may restore a directory's mtime after planting a secret, not its ctime."""
    warm(ws, listed)
    before = os.stat(ws / "docs")
    (ws / "docs" / "late.pem").write_text("k")
    os.utime(ws / "docs", ns=(before.st_atime_ns, before.st_mtime_ns))
    assert os.stat(ws / "docs").st_mtime_ns == before.st_mtime_ns
    assert seal.find(ws).masked_paths == (".env", "docs/late.pem") and listed == ["docs"]


def _only_tree() -> tuple[str, seal_cache.Tree]:
    (key, tree), *others = seal_cache.CACHE.trees.items()
    assert not others
    return key, tree


def test_the_cache_file_is_private(ws: Path, listed: list[str], data_dir: Path) -> None:
    warm(ws, listed)
    kept = kept_file(ws)
    assert kept.parent == data_dir / "cache" / "seal"
    assert kept.stat().st_mode & 0o777 == 0o600 and kept.parent.stat().st_mode & 0o777 == 0o700
    assert [p.name for p in kept.parent.iterdir()] == [kept.name]  # no temporary file left


def _corrupt(kept: Path) -> None:
    """One bit of the root's record flipped: ``.env`` kept as masked reads ``.enw`` (the CRC-32 is
    what refuses it; read as is, the record would hide the secret)."""
    data = bytearray(kept.read_bytes())
    where = data.rindex(b".env")  # the root's record: after the key, which names .env too
    data[where + 3] ^= 0x01
    kept.write_bytes(bytes(data))


def _forged(kept: Path, **root: Any) -> None:
    """A file with the right key, checksum and times whose record of the root is changed: by default
    to leave ``.env`` out."""
    key, tree = _only_tree()
    changes: dict[str, Any] = root or {"masked": ()}
    forged = {rel: tuple(d._replace(**changes) if rel == "" else d) for rel, d in tree.items()}
    payload = marshal.dumps((key, forged))
    kept.write_bytes(seal_cache._MAGIC + zlib.crc32(payload).to_bytes(4, "big") + payload)


def _forged_open(kept: Path) -> None:
    _forged(kept)
    kept.chmod(0o666)


def _swapped_for_a_symlink(kept: Path) -> None:
    kept.rename(kept.with_name("real"))
    kept.symlink_to("real")


def _swapped_for_a_directory(kept: Path) -> None:
    kept.unlink()
    kept.mkdir()


DAMAGE: dict[str, Callable[[Path], object]] = {
    "empty": lambda kept: kept.write_bytes(b""),
    "truncated": lambda kept: kept.write_bytes(kept.read_bytes()[:-40]),
    "one bit flipped": lambda kept: _corrupt(kept),
    "garbage": lambda kept: kept.write_bytes(os.urandom(4096)),
    "another format": lambda kept: kept.write_bytes(b"sandbox-seal-v0\n" + kept.read_bytes()[20:]),
    "a directory": _swapped_for_a_directory,
    "a symlink": _swapped_for_a_symlink,
    "forged, writable by others": _forged_open,
    "forged, a name reaching out": lambda kept: _forged(kept, masked=(), entered=("src", "docs", "..")),
    "forged, a path for a name": lambda kept: _forged(kept, masked=(), entered=("src", "docs/../..")),
    "forged, a masked entry of another shape": lambda kept: _forged(kept, masked=((".env", 1),)),
    "forged, a record of another shape": lambda kept: _forged(kept, masked=(), entered=[]),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_cache_file_is_ignored_and_rewritten(ws: Path, listed: list[str], damage: str) -> None:
    warm(ws, listed)
    kept = kept_file(ws)
    DAMAGE[damage](kept)
    seal_cache.CACHE.clear()  # a new process: the disk is all it has
    listed.clear()
    assert seal.find(ws).masked_paths == (".env",)
    assert len(listed) == 6  # nothing of it believed
    if kept.is_file() and not kept.is_symlink():
        seal_cache.CACHE.clear()
        listed.clear()
        assert seal.find(ws).masked_paths == (".env",) and listed == []  # rewritten, sound again


def test_a_forged_file_is_believed_only_where_only_we_can_write(ws: Path, listed: list[str]) -> None:
    """The check above can fail: the same forgery, mode 0600 and ours, is read (the data directory
    is the user's own; one inside the workspace is not used, see the next test)."""
    warm(ws, listed)
    kept = kept_file(ws)
    _forged(kept)
    seal_cache.CACHE.clear()
    assert seal.find(ws).masked_paths == ()


def test_a_data_directory_inside_the_workspace_is_not_used(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A jail in ``rw`` mode could write it, and a forged cache would hide a secret."""
    inside = ws / "docs" / "data"
    monkeypatch.setenv("SANDBOX_DATA_DIR", str(inside))
    assert seal_cache.cache_file("k", os.path.realpath(ws)) is None and seal_cache.cache_file("k", "/") is None
    assert seal_cache.cache_file("k", os.path.realpath(ws / "src")) is not None  # a sibling is fine
    for _ in range(2):
        assert seal.find(ws).masked_paths == (".env",)
    assert not (inside / "cache" / "seal").exists()


def test_a_foreign_version_is_ignored(ws: Path, listed: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    warm(ws, listed)
    seal_cache.CACHE.clear()
    monkeypatch.setattr(seal_cache, "code_version", lambda: ["0.0.0-other"])
    listed.clear()
    assert seal.find(ws).masked_paths == (".env",) and len(listed) == 6


def test_two_workspaces_do_not_share_a_cache(ws: Path, listed: list[str], tmp_path: Path) -> None:
    other = tmp_path / "other"
    (other / "src").mkdir(parents=True)
    (other / "src" / "tls.pem").write_text("k")
    age()
    warm(ws, listed)
    assert seal.find(other).masked_paths == ("src/tls.pem",)
    assert seal.find(ws).masked_paths == (".env",)
    (other / "src" / "tls.pem").unlink()
    (ws / "src" / "tls.pem").write_text("k")
    assert seal.find(other).masked_paths == ()
    assert seal.find(ws).masked_paths == (".env", "src/tls.pem")


def test_more_workspaces_than_the_memory_holds(tmp_path: Path) -> None:
    spaces = []
    for index in range(seal_cache.LRU_SIZE + 2):
        space = tmp_path / f"w{index}"
        space.mkdir()
        (space / f"{index}.key").write_text("k")
        spaces.append(space)
    for _ in range(2):
        for index, space in enumerate(spaces):
            assert seal.find(space).masked_paths == (f"{index}.key",)
    assert len(seal_cache.CACHE.trees) == seal_cache.LRU_SIZE


def test_changed_globs_are_judged_afresh(ws: Path, listed: list[str]) -> None:
    (ws / "docs" / "vault").mkdir()
    (ws / "docs" / "vault" / "token").write_text("t")
    age()
    assert seal.find(ws, ("docs/vault/**",)).masked_paths == (".env", "docs/vault")
    assert seal.find(ws).masked_paths == (".env",)
    assert seal.find(ws, ("*.py",)).masked_paths == (".env", "src/app.py", "src/pkg/deep/deeper/mod.py")
    listed.clear()
    assert seal.find(ws, ("docs/vault/**",)).masked_paths == (".env", "docs/vault") and listed == []
    assert kept_file(ws) != kept_file(ws, ("docs/vault/**",))


def test_max_masks_is_kept_warm_as_cold(ws: Path, listed: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(seal, "MAX_MASKS", 2)
    (ws / "docs" / "a.key").write_text("k")
    age()
    assert len(seal.find(ws).masked) == 2
    listed.clear()
    assert len(seal.find(ws).masked) == 2 and listed == []
    (ws / "src" / "pkg" / "deep" / "b.key").write_text("k")
    with pytest.raises(seal.TooManySecrets):
        seal.find(ws)
    with pytest.raises(seal.TooManySecrets):
        seal.find(ws)


CHILD = """
import json, sys
from sandbox.backends import seal
seal.RACY_NS = {racy}
listed = []
listing = seal._Search.list
def counting(self, path, rel):
    listed.append(rel)
    return listing(self, path, rel)
seal._Search.list = counting
print(json.dumps([seal.find(sys.argv[1]).masked_paths, sorted(listed)]))
"""


def test_the_disk_cache_is_shared_across_processes(ws: Path, data_dir: Path) -> None:
    def child() -> tuple[list[str], list[str]]:
        done = subprocess.run(
            [sys.executable, "-c", CHILD.format(racy=RACY_NS), str(ws)],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "SANDBOX_DATA_DIR": str(data_dir)},
        )
        masked, listed = json.loads(done.stdout)
        return masked, listed

    assert child() == ([".env"], ["", "docs", "src", "src/pkg", "src/pkg/deep", "src/pkg/deep/deeper"])
    assert child() == ([".env"], [])  # the first process's walk, read from disk
    (ws / "src" / "pkg" / "deep" / "deeper" / "id_ecdsa").write_text("k")
    assert child() == ([".env", "src/pkg/deep/deeper/id_ecdsa"], ["src/pkg/deep/deeper"])
    seal_cache.CACHE.clear()
    assert seal.find(ws).masked_paths == (".env", "src/pkg/deep/deeper/id_ecdsa")  # and this one reads it


def test_the_disk_keeps_the_latest_searches_only(
    tmp_path: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(seal_cache, "KEPT_FILES", 3)
    spaces = [tmp_path / f"w{index}" for index in range(5)]
    for space in spaces:
        space.mkdir()
        seal.find(space)
        time.sleep(0.01)  # distinct mtimes on coarse clocks
    folder = data_dir / "cache" / "seal"
    assert len(list(folder.iterdir())) == 3
    seal_cache.CACHE.clear()
    assert all(kept_file(space).exists() for space in spaces[-3:])  # the last three written
