"""The way forward: what a timeout or a refusal tells its reader to do next, declared once.

A timeout names its limit, where that limit came from and how to raise it
(:class:`TimeoutSource`): the profile's ``timeouts.default_s`` (the file, the key, the value),
``--timeout``, a tool call's own ``timeout`` argument or the tool's default, or the profile's
``timeouts.max_s`` where a wish above it was clamped. Raising it is the flag or argument up to
``timeouts.max_s``; at that ceiling, a profile with a higher one (the shipped ones are named).

A GUARANTEE_UNAVAILABLE refusal (:func:`explain`) keeps its first line and adds, for each unmet
guarantee, what asked for it (the profile's ``requires``, a setting, or the flag that set it),
the shipped profiles that would run here and what each gives up against the refused one, and
the host change that would provide the guarantee (:func:`host_changes`), or the alternative flag
(``--mount copy`` for an overlay). The same facts go in the error's ``data``: ``required_by``,
``runs_here``, ``remedy``.

No pydantic at import: ``sandbox run``'s quick path reports its timeouts through this module
with a profile read back from its cache (the fields only).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from sandbox.errors import GuaranteeUnavailable, SandboxError

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from sandbox.guarantees import Report
    from sandbox.profile import Profile

    Probe = Callable[[str], Report]

TimeoutKind = Literal["profile", "flag", "call", "tool-default", "clamped"]
SHIPPED = Path(__file__).parent / "profiles"


# ---- timeouts -----------------------------------------------------------------------------------


def span(seconds: float) -> str:
    """``600`` -> ``600 s (10 min)``: the unit a reader checks a suite's length in."""
    text = f"{seconds:g} s"
    if seconds >= 3600 and seconds % 360 == 0:
        return f"{text} ({seconds / 3600:g} h)"
    if seconds >= 120 and seconds % 6 == 0:
        return f"{text} ({seconds / 60:g} min)"
    return text


def profile_label(profile: Profile) -> str:
    """``profile untrusted``, or ``profile custom (/path/custom.toml)`` for a file of the user's."""
    source = getattr(profile, "source", None)
    if source is None or Path(source).parent.resolve() == SHIPPED.resolve():
        return f"profile {profile.name}"
    return f"profile {profile.name} ({source})"


class TimeoutSource(NamedTuple):
    """One call's time limit: its value, where it came from, and how a caller raises it."""

    kind: TimeoutKind
    limit_s: float
    origin: str  # "--timeout 5", "profile untrusted (timeouts.default_s = 600)" ...
    raise_with: str  # "--timeout S", "the call's timeout argument" ...
    profile: str
    max_s: float

    def line(self) -> str:
        return f"timed out after {span(self.limit_s)}, the limit set by {self.origin}"

    def how_to_raise(self) -> str:
        ceiling = f"profile {self.profile}'s timeouts.max_s"
        if self.limit_s < self.max_s:
            return f"to allow longer: {self.raise_with}, up to {span(self.max_s)} ({ceiling})"
        higher = [f"{name} ({span(top)})" for name, top in shipped_ceilings().items() if top > self.max_s]
        wider = f"a shipped one: {', '.join(higher)}" if higher else "a profile file of your own"
        return f"{span(self.max_s)} is {ceiling}, the ceiling; for longer, use a profile with a higher one ({wider})"

    def to_dict(self) -> dict[str, Any]:
        return {**self._asdict(), "raise": self.how_to_raise()}


def for_run(flag: float | None, limit: float, profile: Profile) -> TimeoutSource:
    """``sandbox run``'s limit: ``--timeout`` when given, else the profile's ``timeouts.default_s``."""
    if flag is not None:
        return _source("flag", limit, f"--timeout {flag:g}", "--timeout S", profile)
    return _source("profile", limit, _default_origin(profile), "--timeout S", profile)


def for_call(given: float | None, limit: float, profile: Profile, tool: str) -> TimeoutSource:
    """A tool call's limit: its own ``timeout`` argument, else the tool's default."""
    how = "the call's timeout argument (seconds)"
    if given is not None:
        return _source("call", limit, f"the call's timeout argument ({span(given)})", how, profile)
    return _source("tool-default", limit, f"the {tool} tool's default ({span(limit)})", how, profile)


def clamped(wanted: float, limit: float, profile: Profile, raise_with: str) -> TimeoutSource:
    """A wish above ``timeouts.max_s`` cut down to it (a plugin manifest's timeout)."""
    if wanted <= limit:
        return _source("call", limit, f"{raise_with} ({span(wanted)})", raise_with, profile)
    origin = f"{profile_label(profile)}'s timeouts.max_s = {limit:g} (asked for {span(wanted)})"
    return _source("clamped", limit, origin, raise_with, profile)


def _source(kind: TimeoutKind, limit: float, origin: str, raise_with: str, profile: Profile) -> TimeoutSource:
    return TimeoutSource(kind, float(limit), origin, raise_with, profile.name, float(profile.timeouts.max_s))


def _default_origin(profile: Profile) -> str:
    return f"{profile_label(profile)}: timeouts.default_s = {profile.timeouts.default_s:g}"


def shipped_ceilings() -> dict[str, float]:
    """Each shipped profile's ``timeouts.max_s``, read from its file (no validation: only named)."""
    import tomllib  # here: only a call at its ceiling reads them

    ceilings = {}
    for path in sorted(SHIPPED.glob("*.toml")):
        try:
            top = tomllib.loads(path.read_text(encoding="utf-8")).get("timeouts", {}).get("max_s")
        except (OSError, tomllib.TOMLDecodeError):
            continue
        if isinstance(top, int | float):
            ceilings[path.stem] = float(top)
    return ceilings


# ---- guarantees a host cannot give ----------------------------------------------------------------

# The settings that ask for a guarantee beyond ``requires`` (see Report.missing), and the flag
# that sets each from ``sandbox run``.
SETTING_OF = {
    "overlay": "mount.strategy",
    "net-allowlist": "network.mode",
    "net-transparent": "network.transparent",
}
CGROUP_BACKED = {"memory-limit", "pids-limit", "cpu-limit", "limits.memory", "limits.pids", "limits.cpus"}
USERNS = (
    "allow unprivileged user namespaces: sudo sysctl -w kernel.unprivileged_userns_clone=1 (Debian), or "
    "sudo sysctl -w kernel.apparmor_restrict_unprivileged_userns=0 (Ubuntu 23.10 and later)"
)
ALTERNATIVES = {"overlay": "--mount copy (the same review of the changes, from a private copy instead of an overlay)"}


def explain(
    error: GuaranteeUnavailable, profile: Profile, flags: Mapping[str, str], probe: Probe
) -> GuaranteeUnavailable:
    """``error`` with the way forward added to its message and its data.

    ``flags``: profile key -> the flag that set it as typed (``{"mount.strategy": "--mount overlay"}``).
    ``probe``: a backend's report by name (the backends layer's, which calls this one).
    """
    unmet, unavailable = _unmet(profile, probe)
    required = {name: required_by(name, profile, flags) for name in unmet}
    remedy = {name: [*_alternative(name), *host_changes(name, why)] for name, why in unmet.items()}
    remedy.update({f"backend {name}": backend_changes(name, why) for name, why in unavailable.items()})
    blamed = {who for who in required.values() if who.startswith("--")}
    here = runs_here(profile, list(unmet), probe, same_too=bool(blamed))
    lines = [f"required by: {', '.join(f'{g}: {who}' for g, who in required.items())}"] if required else []
    lines += [f"would run here: {' | '.join(_alternative_text(alt) for alt in here) or 'no shipped profile'}"]
    lines += [f"to get {name}: {'; or '.join(ways)}" for name, ways in remedy.items() if ways]
    message = "\n".join([_head(error, profile, required, unmet, unavailable), *(f"  {line}" for line in lines)])
    data = {**error.data, "required_by": required, "runs_here": here, "remedy": remedy}
    return GuaranteeUnavailable(message, **data)


def _head(
    error: GuaranteeUnavailable,
    profile: Profile,
    required: dict[str, str],
    unmet: dict[str, str],
    unavailable: dict[str, str],
) -> str:
    """The first line: who asked (the flag, when a flag did) for what, and why each is missing."""
    if not unmet:
        return error.message  # nothing found missing now (a transient probe): the original words
    flagged = {who for who in required.values() if who.startswith("--")}
    who = " and ".join(sorted(flagged)) if len(flagged) == len(set(required.values())) else f"profile {profile.name!r}"
    parts = [f"{name} ({why})" for name, why in unmet.items()]
    parts += [f"backend {name} is unavailable ({why})" for name, why in unavailable.items()]
    return f"{who} needs what this host cannot give: " + "; ".join(parts)


def _unmet(profile: Profile, probe: Probe) -> tuple[dict[str, str], dict[str, str]]:
    """What the usable backend nearest to running this profile lacks (name -> why: the fewest
    refusals, the earlier in ``auto``'s order on a tie), and the unavailable backends. A backend
    further off (Landlock, refusing a ``tmp_size`` besides) is not blamed for what the nearest
    one gives."""
    from sandbox.backends import AUTO_ORDER

    nearest: dict[str, str] | None = None
    unavailable: dict[str, str] = {}
    for name in AUTO_ORDER if profile.backend == "auto" else (profile.backend,):
        report = probe(name)
        if not report.available:
            unavailable[name] = report.reason
            continue
        refused = {key: f"{name}: {why}" for key, why in _refusals(report, profile).items()}
        if nearest is None or len(refused) < len(nearest):
            nearest = refused
    return nearest or {}, unavailable


def _refusals(report: Report, profile: Profile) -> dict[str, str]:
    return {**report.missing(profile.requires, profile), **report.refused_limits(profile)}


def required_by(name: str, profile: Profile, flags: Mapping[str, str]) -> str:
    """What asked for ``name``: the flag that set its setting, else the profile's key."""
    key = SETTING_OF.get(name, name if name.startswith("limits.") else "requires")
    if key in flags:
        return flags[key]
    where = profile_label(profile)
    if key == "requires":
        return f"{where}, requires = [..., {name!r}]"
    return f"{where}, {key} = {_value(profile, key)!r}"


def _value(profile: Profile, key: str) -> Any:
    node: Any = profile
    for part in key.split("."):
        node = getattr(node, part)
    return node


def _alternative(name: str) -> list[str]:
    return [ALTERNATIVES[name]] if name in ALTERNATIVES else []


def runs_here(refused: Profile, unmet: list[str], probe: Probe, *, same_too: bool = False) -> list[dict[str, Any]]:
    """The shipped profiles that would run here (never the host backend's), and what each gives up;
    ``same_too``: the refused profile's own name too (a flag, not the profile, asked for too much)."""
    from sandbox import profile as profiles

    found = []
    for name in profiles.available():
        if name == refused.name and not same_too:
            continue
        try:
            other = profiles.load(name)
        except SandboxError:
            continue
        backend = None if other.backend == "host" else _first_backend(other, probe)
        if backend is not None:
            found.append(_gives_up(refused, other, backend, unmet, probe))
    return found


def _first_backend(profile: Profile, probe: Probe) -> str | None:
    from sandbox.backends import AUTO_ORDER

    for name in AUTO_ORDER if profile.backend == "auto" else (profile.backend,):
        report = probe(name)
        if report.available and not _refusals(report, profile):
            return name
    return None


def _gives_up(refused: Profile, other: Profile, backend: str, unmet: list[str], probe: Probe) -> dict[str, Any]:
    report = probe(backend)
    lost: list[str] = [g for g in refused.requires if g not in other.requires and not report.guarantees.get(g, False)]
    lost += [name for name in unmet if name not in lost and not name.startswith("limits.")]
    differs = {
        key: f"{_value(other, key)} (not {_value(refused, key)})"
        for key in ("mount.strategy", "network.mode")
        if _value(other, key) != _value(refused, key)
    }
    return {"profile": other.name, "backend": backend, "gives_up": lost, "differs": differs}


def _alternative_text(alt: dict[str, Any]) -> str:
    lost = ", ".join(alt["gives_up"]) or "nothing the refused profile requires"
    differs = "".join(f"; {key} {value}" for key, value in alt["differs"].items())
    return f"--profile {alt['profile']} ({alt['backend']}; gives up {lost}{differs})"


def host_changes(name: str, why: str = "") -> list[str]:
    """The change to this host that would give guarantee (or limit) ``name``."""
    if name in CGROUP_BACKED:
        return [_cgroup_change()]
    if name == "overlay":
        return ["run as root, or install bubblewrap 0.9 or later (--overlay) or fuse-overlayfs"]
    if name == "net-transparent":
        return ["run as root (a veth pair and nftables rules in the call's network namespace)"]
    if name == "kernel-isolated":
        return [
            "run the docker backend under gVisor: install runsc, register it with the engine (images/dockerd-up.sh "
            'as root does both) and set [docker] runtime = "runsc" in the profile'
        ]
    if name == "seccomp":
        return [f"the filter needs libseccomp (apt-get install libseccomp2) and a writable data directory ({why})"]
    if "namespace" in why or "uid map" in why:
        return [USERNS]
    return []


def _cgroup_change() -> str:
    from sandbox.backends import cgroups

    if os.geteuid() == 0:
        return "mount the controller: cgroup v2 at /sys/fs/cgroup, or its cgroup v1 hierarchy"
    scope = f"run under a delegated systemd scope: {cgroups.DELEGATE_HINT}"
    if (cgroups.CGROUP_ROOT / "cgroup.controllers").exists():  # cgroup v2 already
        return f"{scope}, or run as root"
    return (
        "boot with systemd.unified_cgroup_hierarchy=1 on the kernel command line (cgroup v2: systemd "
        f"delegates no cgroup v1 hierarchy to a user), then {scope}; or run as root"
    )


def backend_changes(name: str, why: str) -> list[str]:
    """The change to this host that would make backend ``name`` usable, from why it is not."""
    if name == "docker" and "Permission denied" in why:
        return [
            "give this user the Docker socket: sudo usermod -aG docker $USER, then log in again "
            "(or set DOCKER_HOST to an engine this user may use: rootless Docker, Podman's socket)"
        ]
    if name == "docker" and "image" in why:
        return ["build the image: sandbox image build"]
    if name == "docker":
        return ["start the Docker daemon (sudo systemctl start docker), or set DOCKER_HOST"]
    if name == "bwrap" and "not installed" in why:
        return ["sudo apt-get install bubblewrap"]
    if name == "bwrap" and ("namespace" in why or "uid map" in why or "Operation not permitted" in why):
        return [USERNS]
    return []
