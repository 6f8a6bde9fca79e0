"""Profiles: what a jail may do, loaded from TOML and validated by pydantic.

A profile names a backend, a mount strategy, network, limits, timeouts, the guarantees it
requires and its policy settings. Errors name the file, the key and the problem, or the flag
that set a value (:meth:`Profile.override`). No setting, in the file or from a flag, may void a
guarantee the profile requires (``net-none`` with ``network.mode = "host"``): that is refused,
never silently weakened.

Here is the profile as a whole, its loading and the checks across its tables; each table and the
sizes it is written in are in :mod:`sandbox.profile_tables`, the ``[policy]`` table in
:mod:`sandbox.profile_policy`.
"""

from __future__ import annotations

import importlib.resources
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BaseModel, Field, ValidationError, model_validator

from sandbox.errors import InvalidArgument
from sandbox.profile_policy import Policy
from sandbox.profile_tables import Bwrap, Docker, Env, Limits, Mount, Network, Secret, Table, Timeouts, Winjob
from sandbox.vocabulary import GUARANTEE_DESCRIPTIONS, BackendChoice, Guarantee

if TYPE_CHECKING:
    from collections.abc import Mapping


def _with_indexes(data: Any) -> Any:
    """A profile's raw data with its indexes' hosts added to ``network.allow`` and their mirror
    variables to ``env.set`` (a spec that does not resolve is left to the field's own validator,
    which names the key, or the flag that gave it)."""
    from sandbox.network import indexes

    if not isinstance(data, dict):
        return data
    network, section = (_as_dict(data.get(key, {})) for key in ("network", "env"))
    specs = network.get("indexes") if isinstance(network, dict) else None
    if not specs or not isinstance(specs, list | tuple):
        return data
    hosts: list[str] = []
    env: dict[str, str] = {}
    for spec in specs:
        try:
            found = indexes.resolve([spec])
        except (InvalidArgument, AttributeError, TypeError):
            continue
        hosts.extend(found.hosts)
        env.update(found.env)
    given = network.get("allow", ())
    env_given = section.get("set", {}) if isinstance(section, dict) else None
    if not isinstance(given, list | tuple) or not isinstance(env_given, dict):
        return data  # the fields' own validators say what is wrong
    allow = list(dict.fromkeys([*given, *hosts]))
    env_set = {**env_given, **env}  # the index the flag named is the one pip must use
    return {**data, "network": {**network, "allow": allow}, "env": {**section, "set": env_set}}


def _as_dict(section: Any) -> Any:
    return section.model_dump() if isinstance(section, BaseModel) else section


class Profile(Table):
    name: str = "custom"
    description: str = ""
    backend: BackendChoice = "auto"
    requires: tuple[Guarantee, ...] = ()
    mount: Mount = Mount()
    network: Network = Network()
    limits: Limits = Limits()
    timeouts: Timeouts = Timeouts()
    env: Env = Env()
    docker: Docker = Docker()
    bwrap: Bwrap = Bwrap()
    winjob: Winjob = Winjob()
    policy: Policy = Policy()
    secrets: dict[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")], Secret] = {}
    source: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _fold_indexes(cls, data: Any) -> Any:
        return _with_indexes(data)

    @model_validator(mode="after")
    def _check(self) -> Profile:
        if self.timeouts.default_s > self.timeouts.max_s:
            raise ValueError("timeouts.default_s is larger than timeouts.max_s")
        if self.secrets and self.network.mode != "allowlist":
            raise ValueError(f"secrets need network.mode = 'allowlist', not {self.network.mode!r}")
        return self

    def with_overrides(self, **changes: Any) -> Profile:
        """A copy with dotted-key overrides (``{"limits.memory": "2GiB"}``), validated again."""
        return self.override(changes)

    def override(self, changes: Mapping[str, Any], labels: Mapping[str, str] | None = None) -> Profile:
        """``with_overrides`` where ``labels`` names who set a key (``{"limits.pids": "--pids"}``):
        errors in those values are blamed on the flag, not on the profile's file."""
        data = self.model_dump()
        for key, value in changes.items():
            if value is None:
                continue
            *parents, leaf = key.split(".")
            node = data
            for part in parents:
                node = node[part]
            node[leaf] = value
        given = {key: labels[key] for key in changes if labels and key in labels and changes[key] is not None}
        return _validate(data, self.source or "<overrides>", given)


# Which setting would silently void a required guarantee, and the values the guarantee allows
# there (none listed: any limit, but a limit).
_NEEDED: dict[Guarantee, tuple[str, tuple[str, ...]]] = {
    "net-none": ("network.mode", ("none",)),
    "net-confined": ("network.mode", ("none", "allowlist")),
    "memory-limit": ("limits.memory", ()),
    "pids-limit": ("limits.pids", ()),
    "cpu-limit": ("limits.cpu_time_s", ()),
    "fsize-limit": ("limits.file_size", ()),
    "tmp-size-limit": ("limits.tmp_size", ()),
}


# Where a flag asked for what the profile forbids, the profile that gives it (issue 32: a user of
# `untrusted` who needs a package index is told where one is allowed).
_WAY: dict[Guarantee, str] = {
    "net-none": ": to install packages or reach hosts, --profile untrusted-deps --allow-index pypi (npm, crates, "
    "go, NAME=URL) or --allow-host HOST",
}


def _setting(profile: Profile, key: str) -> Any:
    node: Any = profile
    for part in key.split("."):
        node = getattr(node, part)
    return node


def _contradiction(profile: Profile) -> tuple[Guarantee, str] | None:
    """The first (guarantee, key) pair where the profile's own settings void what it requires."""
    for guarantee in profile.requires:
        if guarantee not in _NEEDED:
            continue
        key, needed = _NEEDED[guarantee]
        value = _setting(profile, key)
        if (value not in needed) if needed else value is None:
            return guarantee, key
    return None


def _refuse_contradiction(profile: Profile, source: str, labels: Mapping[str, str]) -> None:
    found = _contradiction(profile)
    if found is None:
        return
    guarantee, key = found
    value = _setting(profile, key)
    why = f"{guarantee} ({GUARANTEE_DESCRIPTIONS.get(guarantee, guarantee)}), which profile {profile.name!r} requires"
    if key in labels:
        message = f"{labels[key]} {value} contradicts {why}; choose a profile that does not require it"
        message += _WAY.get(guarantee, "")
    else:
        message = f"invalid profile {source}: {key} = {value!r} contradicts {why}"
    raise InvalidArgument(
        message, guarantee=guarantee, key=key, flag=labels.get(key), profile=profile.name, file=source
    )


def _problem(err: Any) -> str:
    msg = str(err["msg"])
    return msg.removeprefix("Value error, ")


def _flag(loc: tuple[int | str, ...], labels: Mapping[str, str]) -> str | None:
    """The flag that set an error's key; an item of a list is blamed on the flag that gave the list."""
    return labels.get(".".join(str(p) for p in loc if not isinstance(p, int)))


def _format_error(exc: ValidationError, source: str, labels: Mapping[str, str]) -> str:
    keyed, flagged = [], []
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"]) or "(top level)"
        flag = _flag(err["loc"], labels)
        if flag is not None:
            given = f", got {err['input']!r}" if isinstance(err.get("input"), int | float | str) else ""
            flagged.append(f"{flag}: {_problem(err)}{given} (sets {key})")
        else:
            keyed.append(f"{key}: {_problem(err)}")
    parts = ([f"invalid profile {source}: " + "; ".join(keyed)] if keyed else []) + flagged
    return "; ".join(parts)


def _validate(data: dict[str, Any], source: str, labels: Mapping[str, str] | None = None) -> Profile:
    labels = labels or {}
    try:
        profile = Profile.model_validate({**data, "source": source})
    except ValidationError as exc:
        errors = []
        for e in exc.errors():
            key, flag = ".".join(map(str, e["loc"])), _flag(e["loc"], labels)
            errors.append({"key": key, "problem": _problem(e), **({"flag": flag} if flag is not None else {})})
        raise InvalidArgument(_format_error(exc, source, labels), file=source, errors=errors) from exc
    _refuse_contradiction(profile, source, labels)
    return profile


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
    return {
        Path(p.name).stem: Path(str(p))
        for p in sorted(shipped.iterdir(), key=lambda e: e.name)
        if p.name.endswith(".toml")
    }


def load(name_or_path: str | None = None) -> Profile:
    """A shipped profile by name, or a TOML file by path; ``None`` is ``default``."""
    ref = name_or_path or "default"
    shipped = available()
    if ref in shipped:
        return load_file(shipped[ref])
    path = Path(ref)
    if path.suffix == ".toml" or path.exists():
        return load_file(path)
    raise InvalidArgument(f"unknown profile {ref!r}; shipped profiles: {', '.join(shipped) or 'none'}", profile=ref)
