"""Mount strategies and the copy-in/copy-out changeset.

``ro`` and ``rw`` bind the workspace itself. ``copy`` copies it into a private tree the jail
writes to; :meth:`CopyTree.changes` then reports what the jail did, and :meth:`CopyTree.apply`
brings approved changes back as one unit through a journal (:mod:`sandbox.mounts.journal`: all of them
or none, across a crash), without following symlinks, and only where the host file is still the
one that was copied in.

Change detection costs a ``stat`` per file, not a read: the kernel updates a file's ctime on
every write, chmod or rename and nobody can set it back, so an entry whose (inode, ctime) in the
private tree is unchanged since copy-in is unchanged. The same fingerprint of the host file
(device, inode, size, mtime, ctime) guards ``apply``: any write to the host file since copy-in
changes it, and that file is refused with CONFLICT. Content hashes (SHA-256) of changed files
are in the changeset for review.

On Windows (the winjob backend) the same code runs with three differences, each where it is made:
``st_ctime`` there is the creation time, so a version is (volume, file index, size, mtime); the
copy-in is Python's (no ``cp``), copies each file's main stream only (never an alternate data
stream) and never enters a junction or another reparse point; and the apply is
:mod:`sandbox.mounts.winapply`, which reads changeset paths by Windows' rules.

A symlink is judged by where it leads when followed (:func:`link_verdict`), in the host's view
and the private tree's: inside the workspace it is applied like a file; into the read-only system
tree the jail was given (:data:`SYSTEM_TREES`: a venv's ``bin/python3 -> /usr/bin/python3``) it is
carried as a link and flagged ``system-link``, listed but not held back for consent (it can only
name a host file the user can run already); anywhere else it is ``symlink-outside``, never applied.

A profile's ``mount.exclude`` (``.venv``, ``node_modules``) keeps paths out of the private tree:
the jail binds the host's own read-only at the same place, so it can use them without their
being copied, cannot change them, and the changeset lists them as ``untracked``.

The package is the copy-out engine, below the backends, importing nothing above it: :mod:`.stamps`
(entry versions, walks), :mod:`.changeset` (changes, reports, the consent rule, an apply's target),
:mod:`.links` (where a link leads), :mod:`.gitreview` (a repository's changes for review, read
by :mod:`.gitfiles` and :mod:`.gitconfig`), :mod:`.gitobeyed` (what the host's git obeys),
:mod:`.flags` (a change's review flags), :mod:`.hostfs` (host-side file operations, private trees),
:mod:`.envdirs` (environment directories and their cache), :mod:`.applyplan` (an apply's guard and
steps), :mod:`.journal` (the guarded, crash-safe apply), :mod:`.dirfds` (directories opened
without following links), :mod:`.winpaths` and :mod:`.winapply` (Windows' names and apply),
:mod:`.trees` (the copy and the overlay). This face names what the rest of the package's users need, and
imports each only when it is first asked for (``sandbox run``'s quick path reads
:mod:`.gitreview` without the trees and the event loop).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sandbox.faces import lazy

if TYPE_CHECKING:
    from sandbox.mounts.changeset import (
        NOTICE_FLAGS,
        RISKY_FLAGS,
        ApplyReport,
        ApplyTarget,
        Change,
        Changeset,
        apply_order,
        needs_consent,
        selected,
        with_contents,
    )
    from sandbox.mounts.hostfs import copy_file_bytes, private_tree_name, remove_private_tree, run_command
    from sandbox.mounts.links import SYSTEM_TREES, LinkVerdict, in_system_tree_lexically, link_verdict
    from sandbox.mounts.stamps import WINDOWS, Stamp, open_unfollowed, sha256_file, untracked_paths, verbatim, walk
    from sandbox.mounts.trees import CopyTree, OverlayTree, overlay_support

_HOME: dict[str, str] = {
    "ApplyReport": "changeset",
    "ApplyTarget": "changeset",
    "Change": "changeset",
    "Changeset": "changeset",
    "CopyTree": "trees",
    "LinkVerdict": "links",
    "NOTICE_FLAGS": "changeset",
    "OverlayTree": "trees",
    "RISKY_FLAGS": "changeset",
    "SYSTEM_TREES": "links",
    "Stamp": "stamps",
    "WINDOWS": "stamps",
    "apply_order": "changeset",
    "copy_file_bytes": "hostfs",
    "in_system_tree_lexically": "links",
    "link_verdict": "links",
    "needs_consent": "changeset",
    "open_unfollowed": "stamps",
    "overlay_support": "trees",
    "private_tree_name": "hostfs",
    "remove_private_tree": "hostfs",
    "run_command": "hostfs",
    "selected": "changeset",
    "sha256_file": "stamps",
    "untracked_paths": "stamps",
    "verbatim": "stamps",
    "walk": "stamps",
    "with_contents": "changeset",
}

__getattr__, __dir__ = lazy(__name__, {name: f"{__name__}.{home}" for name, home in _HOME.items()}, globals())

__all__ = [
    "NOTICE_FLAGS",
    "RISKY_FLAGS",
    "SYSTEM_TREES",
    "WINDOWS",
    "ApplyReport",
    "ApplyTarget",
    "Change",
    "Changeset",
    "CopyTree",
    "LinkVerdict",
    "OverlayTree",
    "Stamp",
    "apply_order",
    "copy_file_bytes",
    "in_system_tree_lexically",
    "link_verdict",
    "needs_consent",
    "open_unfollowed",
    "overlay_support",
    "private_tree_name",
    "remove_private_tree",
    "run_command",
    "selected",
    "sha256_file",
    "untracked_paths",
    "verbatim",
    "walk",
    "with_contents",
]
