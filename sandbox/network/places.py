"""Where a jail meets its egress proxy: names only, so a jail's arguments are built without the proxy.

A jail of an allowlist profile has the proxy's socket directory bound at :data:`JAIL_DIR`, its
commands' forwarder listening on the jail's own loopback at :data:`PORT`; ``sandbox run``'s quick
path and the Docker backend read these to build a jail, and import nothing else of the network.
"""

from __future__ import annotations

__all__ = ["BUNDLE_FILE", "JAIL_DIR", "NO_PROXY", "PORT", "SOCKET", "SYSTEM_BUNDLE"]

JAIL_DIR = "/run/sandbox-net"
"""Where the proxy's socket directory is bound in the jail (the same path in a container)."""
SOCKET = "proxy.sock"
PORT = 3128
"""The forwarder's port on the jail's own loopback (its namespace: no other user of it)."""
NO_PROXY = "localhost,127.0.0.1,::1"
BUNDLE_FILE = "ca-bundle.pem"
"""In the socket directory when the proxy terminates a host: the host's CAs and the session's
(:mod:`~sandbox.network.ca`), bound over :data:`SYSTEM_BUNDLE` too."""
SYSTEM_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
"""Debian's (and the images') system CA bundle, where tools that read no variable look."""
