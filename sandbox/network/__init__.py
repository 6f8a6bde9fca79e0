"""Network egress by allowlist (``network.mode = "allowlist"``).

- :mod:`~sandbox.network.policy` -- :class:`EgressPolicy`: destinations judged by name and by
  address (the DNS-rebinding defence).
- :mod:`~sandbox.network.resolve` -- name resolution the proxy does itself (the system's, or a
  DNS server named by ``SANDBOX_NET_RESOLVER``).
- :mod:`~sandbox.network.proxy` -- :class:`EgressProxy`: HTTP CONNECT, plain HTTP and SOCKS5 on a
  unix socket, no TLS interception, every refusal a :class:`Denial`.
- :mod:`~sandbox.network.egress` -- one jail's proxy and how its commands reach it.

Nothing is imported here: a profile's validation reads only the policy module.
"""
