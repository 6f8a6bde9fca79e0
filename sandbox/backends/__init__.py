"""Execution backends: ``base`` holds the interface and the loader; each backend is a module.

The names live here, not in ``base``, so the CLI can offer them without importing anyio.
"""

BACKENDS: tuple[str, ...] = ("bwrap", "docker", "host")
AUTO_ORDER: tuple[str, ...] = ("bwrap", "docker")  # host is never chosen by auto
MOUNT_STRATEGIES: tuple[str, ...] = ("ro", "rw", "copy", "overlay")
DEFAULT_COMPARE_REPEAT = 3  # runs per cell of `sandbox compare`
