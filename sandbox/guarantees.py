"""What a backend can enforce on this host, and why not where it cannot.

Each backend's ``probe()`` returns a :class:`Report`; a profile lists the guarantees it requires
and :meth:`Report.missing` names the unmet ones, so a jail is refused rather than weakened.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sandbox.profile import Profile

DESCRIPTIONS: dict[str, str] = {
    "fs-readonly-root": "system directories are mounted read-only",
    "fs-write-confined": "writes land only in the workspace (per mount strategy) and a private /tmp",
    "fs-hidden-home": "home directories, /root, /var/run and host secrets are absent",
    "net-none": "no network but a private loopback",
    "tree-kill": "every process a call starts is killed on timeout, abort or close (pid namespace)",
    "memory-limit": "memory use is capped (cgroup)",
    "pids-limit": "the number of processes is capped (cgroup)",
    "cpu-limit": "CPU time (rlimit) and CPU share (cgroup quota) are capped",
    "fsize-limit": "the size of a written file is capped (rlimit)",
    "tmp-size-limit": "/tmp is a tmpfs of bounded size",
    "no-new-privs": "setuid binaries cannot raise privileges (PR_SET_NO_NEW_PRIVS)",
    "non-root": "commands run as a non-root uid",
    "no-caps": "commands hold no capabilities",
    "env-scrubbed": "only allowlisted environment variables reach the command",
    "new-session": "a new session: no TIOCSTI into the caller's terminal",
    "seccomp": "a seccomp filter restricts system calls",
    "overlay": "an overlay (copy-on-write) mount of the workspace is possible",
}


@dataclass
class Report:
    backend: str
    available: bool
    reason: str = ""
    guarantees: dict[str, bool] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)

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
        return {
            name: self.reasons.get(name, "not provided by this backend")
            for name in needed
            if not self.guarantees.get(name, False)
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
            "details": self.details,
        }
