"""Execution backends: ``base`` holds the interface and the loader; each backend is a module.

The names live in :mod:`sandbox.vocabulary`, not in ``base``, so the CLI can offer them without
importing anyio.
"""

from sandbox.vocabulary import AUTO_ORDER, BACKENDS, MOUNT_STRATEGIES

__all__ = ["AUTO_ORDER", "BACKENDS", "DEFAULT_COMPARE_REPEAT", "MOUNT_STRATEGIES"]

DEFAULT_COMPARE_REPEAT = 3  # runs per cell of `sandbox compare`
