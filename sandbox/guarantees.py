"""What a backend can enforce on this host, and why not where it cannot.

Each backend's ``probe()`` returns a :class:`Report`; a profile lists the guarantees it requires
and :meth:`Report.missing` names the unmet ones, so a jail is refused rather than weakened.

A report also says, limit by limit, which mechanism enforces it here (a cgroup, an rlimit, a
tmpfs size) and whether per call or per process (:class:`Enforcement`). A limit a profile or a
flag sets to a value of its own that nothing here can enforce is refused
(:meth:`Report.refused_limits`); a limit left at the schema's default is best effort and shown
as not enforced, never silently.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from sandbox.profile import Profile
    from sandbox.vocabulary import LimitScope

LIMITS = ("memory", "pids", "cpus", "cpu_time_s", "file_size", "nofile", "tmp_size")


class Enforcement(NamedTuple):
    """How one limit is enforced here: ``how`` (``None``: it cannot be) and over what ``scope``."""

    how: str | None
    scope: LimitScope = ""
    why_not: str = ""

    def to_dict(self) -> dict[str, Any]:
        if self.how is None:
            return {"enforced": False, "why_not": self.why_not}
        return {"enforced": True, "how": self.how, "scope": self.scope}

    def text(self) -> str:
        if self.how is None:
            return f"not enforced ({self.why_not})"
        return f"{self.how}, per {self.scope}"


def asked_for(profile: Profile, name: str) -> bool:
    """Whether a profile or a flag set limit ``name`` to a value of its own (not the schema's default)."""
    value = getattr(profile.limits, name)
    return value is not None and value != type(profile.limits).model_fields[name].default


class Report:
    """What one backend can enforce on this host, with the reason where it cannot."""

    def __init__(self, backend: str, available: bool, reason: str = "") -> None:
        self.backend = backend
        self.available = available
        self.reason = reason
        self.guarantees: dict[str, bool] = {}
        self.reasons: dict[str, str] = {}
        self.details: dict[str, Any] = {}
        self.limits: dict[str, Enforcement] = {}  # empty: the backend enforces them all itself
        self.advice: list[str] = []
        self.notes: list[str] = []  # what the guarantees rest on here, what they do not cover

    def __repr__(self) -> str:
        return f"Report({self.backend!r}, available={self.available}, reason={self.reason!r})"

    def grant(self, name: str, ok: bool, reason: str = "") -> None:
        self.guarantees[name] = ok
        if not ok:
            self.reasons[name] = reason or "not supported"

    def missing(self, requires: tuple[str, ...], profile: Profile | None = None) -> dict[str, str]:
        if not self.available:
            return dict.fromkeys(requires, self.reason) or {"backend": self.reason}
        needed = list(requires)
        if profile is not None and profile.mount.strategy == "overlay":
            needed.append("overlay")
        if profile is not None and profile.network.mode == "allowlist":
            needed.append("net-allowlist")
        if profile is not None and profile.network.transparent:
            needed.append("net-transparent")
        return {
            name: self.reasons.get(name, "not provided by this backend")
            for name in needed
            if not self.guarantees.get(name, False)
        }

    def refused_limits(self, profile: Profile) -> dict[str, str]:
        """``limits.<name>`` -> why not, for each limit the profile asks for that cannot be enforced here."""
        return {
            f"limits.{name}": how.why_not
            for name, how in self.limits.items()
            if how.how is None and asked_for(profile, name)
        }

    def limits_in_force(self, profile: Profile) -> dict[str, dict[str, Any]]:
        """Every limit the profile sets, with how it is enforced here (for ``--json``)."""
        return {
            name: {"value": getattr(profile.limits, name), **how.to_dict()}
            for name, how in self.limits.items()
            if getattr(profile.limits, name) is not None
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "available": self.available,
            "reason": self.reason,
            "guarantees": {
                name: {"ok": ok, **({"why_not": self.reasons[name]} if not ok else {})}
                for name, ok in self.guarantees.items()
            },
            "limits": {name: how.to_dict() for name, how in self.limits.items()},
            "advice": self.advice,
            "notes": self.notes,
            "details": self.details,
        }

    def to_text(self) -> str:
        """What ``sandbox check`` prints for this backend."""
        state = "available" if self.available else f"unavailable: {self.reason}"
        lines = [f"{self.backend}: {state}"]
        for name, ok in self.guarantees.items():
            lines.append(f"  {name:18} " + ("yes" if ok else f"no  ({self.reasons.get(name, '')})"))
        if self.limits:
            lines.append("  limits:")
            lines += [f"    {name:12} {how.text()}" for name, how in self.limits.items()]
        lines += [f"  note: {line}" for line in self.notes]
        lines += [f"  hint: {line}" for line in self.advice]
        return "\n".join(lines)
