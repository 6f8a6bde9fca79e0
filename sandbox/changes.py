"""Kept changesets: what a copy or overlay run changed, kept under an id until applied or discarded.

When a ``copy`` or ``overlay`` run ends with changes, :func:`keep` copies the changed entries out
of the private tree into the data directory, ``changes/<id>/``, before the jail's close removes
that tree::

    changes/ch-0123456789ab/
        manifest.json   id, workspace, created, source, profile, backend, state, and per entry the
                        change (status, kind, modes, target, flags), the SHA-256 of the content as
                        kept, the host entry's Stamp recorded at copy-in, and whether it is applied
        tree/<path>     the content of each added or modified file, 0600, ours

Only the changed files are copied, never the whole private tree: a changeset is usually a few
files of a large workspace, an overlay's merged view is a mount point that cannot be moved, and a
copy of our own (rather than a hard link) gives the store inodes no jail uid owns or can still
write. A directory, symlink or deletion needs no content: the manifest says it all.

Nothing leaves the store unreviewed. :meth:`Kept.diff` shows each file against the host file as
it is *now*; :meth:`Kept.apply` re-hashes the kept content first and refuses with CONFLICT if a
byte differs from the manifest, then hands the entries to :meth:`sandbox.mounts.CopyTree.apply`
over the kept tree with the manifest's host Stamps, so the guard is the very one a live copy
uses: a host entry changed since copy-in is refused. Flagged entries (git hooks, git config,
dotfiles, new executables…) need consent: they are applied only when named in ``only`` or with
``include_flagged``, and are otherwise reported as held back.

A repository's ``.git`` entries are one group (:mod:`sandbox.mounts.gitreview`), applied all together or
not at all: naming ``.git`` or any entry of it in ``only`` names the whole group; without
consent the group is held back whole, as one ``held_back`` item (``"group": "git"``), when its
summary found anything risky (a hook, a risky config key, an entry that is none of git's data
files), and is otherwise applied with the rest, its ``git-config`` flag notwithstanding. The
summary is computed from the kept files when the changeset is kept, and stored in the manifest.

An environment directory (the profile's ``mount.environment``, :mod:`sandbox.mounts.envdirs`: ``.venv``,
``node_modules``…) is a group too: without consent it is held back whole, one ``held_back`` item
(``"group": "environment"``, its one-line summary); naming the directory in ``only`` names all of
its entries, and ``include_environment`` consents to every such directory (their flagged entries
included: they are counted in the summary the reviewer saw). The profile's list is kept in the
manifest, so a later ``apply`` judges by the rule the run had.

On Windows (the winjob backend) the store works the same: the lock is a byte lock on a
``.lock-<id>`` file beside the changeset (``msvcrt.locking``), and a file is read after an
``lstat`` has refused a symlink or reparse point on its way (Windows has no ``O_NOFOLLOW``).

A kept changeset stays until it is discarded, until :data:`APPLIED_RETENTION_S` (a day) after it
was wholly applied (its content is then on the host: a 14,000-file install need not keep 90 MB
for two weeks), or :data:`RETENTION_S` (14 days) after it was kept: the store sweeps itself on
each use. The store is capped (``limits.kept_changes``): a keep that would pass the cap first
prunes applied changesets, then the oldest kept ones, and says so (:attr:`Kept.pruned`); it is
refused only when that is not enough. ``sandbox changes prune`` and ``discard --all`` do it by
hand (:func:`prune`, :func:`discard_all`). A keep interrupted half-way leaves a
``.partial-<pid>-<starttime>-<hex>`` directory, swept once its executor is gone.

The changeset itself is :mod:`sandbox.mounts.kept`, keeping one :mod:`sandbox.mounts.keep`, the
store's retention :mod:`sandbox.mounts.store`: this module is their face.
"""

from __future__ import annotations

from sandbox.mounts.keep import keep, recover
from sandbox.mounts.kept import (
    APPLIED_RETENTION_S,
    DIFF_DEADLINE_S,
    ID,
    MANIFEST,
    RETENTION_S,
    STORE_LIMIT,
    Entry,
    Kept,
    Pruned,
    held_back_line,
    store,
)
from sandbox.mounts.store import discard_all, listing, load, prune, sweep

__all__ = [
    "APPLIED_RETENTION_S",
    "DIFF_DEADLINE_S",
    "ID",
    "MANIFEST",
    "RETENTION_S",
    "STORE_LIMIT",
    "Entry",
    "Kept",
    "Pruned",
    "discard_all",
    "held_back_line",
    "keep",
    "listing",
    "load",
    "prune",
    "recover",
    "store",
    "sweep",
]
