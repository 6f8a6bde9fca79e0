"""Package indexes by name: the hosts an ecosystem's installer needs, in one word.

``--allow-index pypi`` (or ``[network] indexes = ["pypi"]``) opens exactly the hosts pip and uv
download from, and nothing else; ``NAME=URL`` names a private mirror instead (a company's
index, or a test's index on loopback): its host and port alone are allowed, and the jail's
environment points the ecosystem's installers at it (``PIP_INDEX_URL``, ``npm_config_registry``
...), so the one line both opens the door and uses it. An index is an allowlist entry like any
other: the proxy still checks every address it resolves to, and ``deny`` still wins.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from sandbox.errors import InvalidArgument

if TYPE_CHECKING:
    from collections.abc import Iterable


@dataclasses.dataclass(frozen=True)
class Preset:
    """One ecosystem's public index: the hosts it needs and the variables that name a mirror."""

    name: str
    hosts: tuple[str, ...]
    mirror_env: tuple[str, ...]  # each set to the URL of ``NAME=URL``
    about: str


PRESETS: dict[str, Preset] = {
    preset.name: preset
    for preset in (
        Preset("pypi", ("pypi.org", "files.pythonhosted.org"), ("PIP_INDEX_URL", "UV_INDEX_URL"), "pip, uv"),
        Preset("npm", ("registry.npmjs.org",), ("npm_config_registry",), "npm, npx"),
        Preset("crates", ("index.crates.io", "static.crates.io", "crates.io"), (), "cargo"),
        Preset("go", ("proxy.golang.org", "sum.golang.org"), ("GOPROXY",), "go modules"),
    )
}


@dataclasses.dataclass(frozen=True)
class Indexes:
    """What a list of index specs comes to: allowlist patterns and the jail's variables."""

    specs: tuple[str, ...] = ()
    hosts: tuple[str, ...] = ()
    env: dict[str, str] = dataclasses.field(default_factory=dict)


def resolve(specs: Iterable[str]) -> Indexes:
    """``["pypi", "npm=http://10.0.0.5:4873/"]`` -> the hosts to allow and the variables to set.

    An unknown name or a URL that is not ``http(s)://host[:port]/...`` is refused with
    :class:`InvalidArgument` naming the names there are.
    """
    hosts: list[str] = []
    env: dict[str, str] = {}
    given = tuple(specs)
    for spec in given:
        name, _, url = spec.partition("=")
        preset = PRESETS.get(name.strip().lower())
        if preset is None:
            known = ", ".join(sorted(PRESETS))
            raise InvalidArgument(f"unknown package index {name!r}: the names are {known}, or NAME=URL for a mirror")
        if not url:
            hosts.extend(host for host in preset.hosts if host not in hosts)
            continue
        if not preset.mirror_env:
            raise InvalidArgument(f"--allow-index {preset.name}=URL: {preset.about} takes no mirror URL here")
        host = _mirror_host(spec, url)
        hosts.append(host)
        env.update(dict.fromkeys(preset.mirror_env, url))
        env.update(_plain_http(preset, url, host))
    return Indexes(given, tuple(hosts), env)


def _plain_http(preset: Preset, url: str, host: str) -> dict[str, str]:
    """pip and uv ignore an ``http://`` index unless told to trust its host: the user named this
    mirror, so the one line still works (its traffic is then as open to tampering as HTTP is)."""
    if preset.name != "pypi" or urlsplit(url).scheme != "http":
        return {}
    return {"PIP_TRUSTED_HOST": host.rpartition(":")[0].strip("[]"), "UV_INSECURE_HOST": host}


def _mirror_host(spec: str, url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        raise InvalidArgument(f"index {spec!r}: give NAME=http(s)://host[:port]/path")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{host}:{port}"
