"""Profiles: what a jail may do, loaded from TOML and validated by pydantic.

A profile names a backend, a mount strategy, network, limits, timeouts, the guarantees it
requires and its policy settings. Errors name the file, the key and the problem.
"""

from __future__ import annotations

import importlib.resources
import re
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from sandbox.errors import InvalidArgument


BackendName = Literal["auto", "bwrap", "docker", "host"]
MountStrategy = Literal["ro", "rw", "copy", "overlay"]
Guarantee = Literal[
    "fs-readonly-root",
    "fs-write-confined",
    "fs-hidden-home",
    "net-none",
    "tree-kill",
    "memory-limit",
    "pids-limit",
    "cpu-limit",
    "fsize-limit",
    "tmp-size-limit",
    "no-new-privs",
    "non-root",
    "no-caps",
    "env-scrubbed",
    "new-session",
    "seccomp",
    "overlay",
]

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}


def parse_size(value: object) -> int:
    """``"512MiB"``, ``"1g"``, ``"2 GB"`` or an int of bytes -> bytes."""
    if isinstance(value, bool):
        raise ValueError("a size is a number of bytes or a string like '512MiB'")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("a size cannot be negative")
        return value
    match = _SIZE.match(str(value))
    if not match:
        raise ValueError(f"{value!r} is not a size (examples: 4096, '512MiB', '1GB')")
    number, unit = float(match.group(1)), (match.group(2) or "").lower()
    base = unit[:1]
    scale = 1024 ** ("kmgt".index(base) + 1) if "i" in unit else _UNITS[base]
    return int(number * scale)


Size = Annotated[int, BeforeValidator(parse_size)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Mount(_Model):
    strategy: MountStrategy = "rw"


class Network(_Model):
    mode: Literal["none", "host"] = "none"


class Limits(_Model):
    memory: Size | None = parse_size("1GiB")
    pids: int | None = Field(256, ge=8)
    cpu_time_s: int | None = Field(300, ge=1)
    cpus: float | None = Field(None, gt=0)
    file_size: Size | None = parse_size("1GiB")
    tmp_size: Size | None = parse_size("256MiB")
    nofile: int | None = Field(1024, ge=16)
    capture_bytes: Size = Field(parse_size("1MiB"), ge=1024)


class Timeouts(_Model):
    default_s: float = Field(60, ge=1, le=300)
    max_s: float = Field(300, ge=1, le=300)
    kill_grace_s: float = Field(0.5, ge=0, le=10)


class Env(_Model):
    """Names passed through from the caller's environment on top of the built-in allowlist."""

    allow: tuple[str, ...] = ()
    set: dict[str, str] = Field(default_factory=dict)


class Docker(_Model):
    image: str | None = None
    lifecycle: Literal["session", "call"] = "session"
    user: str = "1000:1000"


class Policy(_Model):
    """Permission-layer settings; the policy package reads them (see sandbox/policy)."""

    mode: Literal["ask", "accept-edits", "auto"] | None = None
    operating_mode: Literal["agent", "plan"] = "agent"
    unattended: Literal["deny", "allow"] = "deny"
    approval_timeout_s: float = Field(120, gt=0, le=3600)
    deny_read: tuple[str, ...] = ()
    deny_write: tuple[str, ...] = ()
    confirm_write: tuple[str, ...] = ()
    remove_rules: tuple[str, ...] = ()
    rules: tuple[dict[str, Any], ...] = ()


class Profile(_Model):
    name: str = "custom"
    description: str = ""
    backend: BackendName = "auto"
    requires: tuple[Guarantee, ...] = ()
    mount: Mount = Mount()
    network: Network = Network()
    limits: Limits = Limits()
    timeouts: Timeouts = Timeouts()
    env: Env = Env()
    docker: Docker = Docker()
    policy: Policy = Policy()
    source: str | None = None

    @model_validator(mode="after")
    def _check(self) -> Profile:
        if self.timeouts.default_s > self.timeouts.max_s:
            raise ValueError("timeouts.default_s is larger than timeouts.max_s")
        return self

    def with_overrides(self, **changes: Any) -> Profile:
        """A copy with dotted-key overrides (``{"limits.memory": "2GiB"}``), validated again."""
        data = self.model_dump()
        for key, value in changes.items():
            if value is None:
                continue
            *parents, leaf = key.split(".")
            node = data
            for part in parents:
                node = node[part]
            node[leaf] = value
        return _validate(data, self.source or "<overrides>")


def _format_error(exc: ValidationError, source: str) -> str:
    problems = []
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"]) or "(top level)"
        problems.append(f"{key}: {err['msg']}")
    return f"invalid profile {source}: " + "; ".join(problems)


def _validate(data: dict[str, Any], source: str) -> Profile:
    try:
        return Profile.model_validate({**data, "source": source})
    except ValidationError as exc:
        raise InvalidArgument(_format_error(exc, source), file=source,
                              errors=[{"key": ".".join(map(str, e["loc"])), "problem": e["msg"]}
                                      for e in exc.errors()]) from exc


def load_file(path: Path) -> Profile:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InvalidArgument(f"cannot read profile {path}: {exc.strerror}", file=str(path)) from exc
    except tomllib.TOMLDecodeError as exc:
        raise InvalidArgument(f"invalid profile {path}: {exc}", file=str(path)) from exc
    data.setdefault("name", path.stem)
    return _validate(data, str(path))


def available() -> dict[str, Path]:
    """The shipped profiles: package data (``sandbox/profiles``, a link to ``profiles/`` in a checkout)."""
    shipped = importlib.resources.files("sandbox") / "profiles"
    return {Path(p.name).stem: Path(str(p)) for p in sorted(shipped.iterdir(), key=lambda e: e.name)
            if p.name.endswith(".toml")}


def load(name_or_path: str | None = None) -> Profile:
    """A shipped profile by name, or a TOML file by path; ``None`` is ``default``."""
    ref = name_or_path or "default"
    shipped = available()
    if ref in shipped:
        return load_file(shipped[ref])
    path = Path(ref)
    if path.suffix == ".toml" or path.exists():
        return load_file(path)
    raise InvalidArgument(
        f"unknown profile {ref!r}; shipped profiles: {', '.join(shipped) or 'none'}", profile=ref
    )
