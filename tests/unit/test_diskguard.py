"""The disk guard's bounds, on made-up looks (the attacks on real jails: tests/attack/test_disk_fill.py)."""

from __future__ import annotations

from pathlib import Path

from sandbox.diskguard import DEFAULT_RESERVE, SLACK, Guard, Space
from sandbox.profile_tables import Limits

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
