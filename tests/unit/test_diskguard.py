"""The disk guard's bounds, on made-up looks (the attacks on real jails: tests/attack/test_disk_fill.py)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from sandbox.diskguard import DEFAULT_RESERVE, SLACK, Guard, Space
from sandbox.profile_tables import Limits

if TYPE_CHECKING:
    import pytest

GiB = 2**30


def _guard(**limits: int) -> Guard:
    return Guard([Path("/d")], Limits(**limits))


def test_the_default_reserve_is_a_gib_or_a_twentieth_of_a_small_disk() -> None:
    assert _guard().reserve(Space(free=0, size=100 * GiB)) == DEFAULT_RESERVE
    assert _guard().reserve(Space(free=0, size=10 * GiB)) == GiB // 2
    assert _guard(disk_reserve=3 * GiB).reserve(Space(free=0, size=10 * GiB)) == 3 * GiB


def test_a_call_that_takes_the_disk_below_the_reserve_is_stopped() -> None:
    start = {"/d": Space(free=2 * GiB, size=100 * GiB)}
    breach, _ = _guard().check(start, {"/d": Space(free=GiB - 1, size=100 * GiB)})
    assert breach is not None
    assert (breach.bound, breach.limit, breach.used) == ("limits.disk_reserve", GiB, GiB + 1)
    assert breach.error().data["errno"] == "ENOSPC"


def test_a_disk_others_filled_leaves_a_call_a_little_slack_and_none_below_half_the_reserve() -> None:
    def space(free: int) -> dict[str, Space]:
        return {"/d": Space(free=free, size=100 * GiB)}

    low, lower = 3 * GiB // 4, GiB // 4
    assert _guard().check(space(low), space(low - 4096))[0] is None  # the session's own records
    assert _guard().check(space(low), space(low - SLACK - 1))[0] is not None
    assert _guard().check(space(lower), space(lower))[0] is None
    assert _guard().check(space(lower), space(lower - 4096))[0] is not None


def test_disk_write_bounds_what_one_call_takes() -> None:
    start = {"/d": Space(free=50 * GiB, size=100 * GiB)}
    ok, headroom = _guard(disk_write=GiB).check(start, {"/d": Space(free=50 * GiB - 100, size=100 * GiB)})
    assert ok is None and headroom == GiB - 100
    breach, _ = _guard(disk_write=GiB).check(start, {"/d": Space(free=49 * GiB - 1, size=100 * GiB)})
    assert breach is not None and breach.bound == "limits.disk_write"


def test_a_call_that_ends_between_two_looks_is_judged_by_one_more(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer that fills the page cache in tens of milliseconds may finish before the next look:
    the look taken as the call ends still finds what it took."""
    from sandbox import diskguard

    free = [50 * GiB]
    monkeypatch.setattr(diskguard, "_space", lambda _path: Space(free=free[0], size=100 * GiB))
    watch = diskguard.Watch(Guard([tmp_path], Limits(disk_write=16 * 2**20)))
    assert watch.last() is None
    free[0] -= 256 * 2**20  # what dd wrote before the guard looked again
    breach = watch.last()
    assert breach is not None and (breach.bound, breach.used) == ("limits.disk_write", 256 * 2**20)


def test_the_last_look_leaves_the_reserve_to_the_running_watch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Near the reserve, a short call would answer for what others wrote on the disk meanwhile."""
    from sandbox import diskguard

    free = [2 * GiB]
    monkeypatch.setattr(diskguard, "_space", lambda _path: Space(free=free[0], size=100 * GiB))
    watch = diskguard.Watch(Guard([tmp_path], Limits()))
    free[0] = GiB - 1
    assert watch.last() is None
