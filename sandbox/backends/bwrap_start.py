"""Starting bubblewrap, in one place: the per-call jail, the warm jail's agent and ``sandbox run``'s quick path.

bwrap reports the host pid of its namespace's init on ``--info-fd`` (one JSON object). With
``--block-fd`` it holds the command until the host writes a byte, so that init is confined first
(its cgroups and rlimits, the transparent network's veth) and no process of the call ever runs
unconfined; with ``--seccomp`` it loads the filter it reads from that descriptor.

:class:`StartFds` makes those descriptors and closes each end where it belongs; :func:`command`
is the whole argv; :func:`wait_init_pid` reads the init's pid for the quick path (no event
loop: this module imports nothing heavy), :func:`sandbox.backends.bwrap_jail.read_init_pid` on
the event loop, and a bwrap that did not start is one :class:`~sandbox.errors.BackendUnavailable`
(:func:`not_started`, :func:`failed`), said the same way everywhere.
"""

from __future__ import annotations

import os
import select
import time
from typing import TYPE_CHECKING

from sandbox.backends.bwrap_argv import InfoReader
from sandbox.errors import BackendUnavailable

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

START_TIMEOUT_S = 30.0


class StartFds:
    """The descriptors of one start: ours (the info pipe's read end, the block pipe's write end)
    and bwrap's (the other ends and the seccomp filter), which :meth:`handed_over` closes here
    once bwrap holds them: the end of file on the info pipe then means bwrap is gone.

    Open it inside ``confine.starting(...)``: a failure to make a pipe is the start's failure.
    """

    def __init__(self, *, block: bool, seccomp_fd: int | None) -> None:
        self._open: list[int] = [] if seccomp_fd is None else [seccomp_fd]
        self.seccomp_fd = seccomp_fd
        try:
            self.info_r, self.info_w = self._pipe()
            self.block_r, self.block_w = self._pipe() if block else (-1, -1)
        except BaseException:
            self.close()
            raise

    def _pipe(self) -> tuple[int, int]:
        r, w = os.pipe2(os.O_CLOEXEC)
        self._open += [r, w]
        return r, w

    @property
    def theirs(self) -> tuple[int, ...]:
        """What bwrap is given (``pass_fds``)."""
        return tuple(fd for fd in (self.info_w, self.block_r, self.seccomp_fd) if fd is not None and fd >= 0)

    def args(self) -> list[str]:
        held = ["--block-fd", str(self.block_r)] if self.block_r >= 0 else []
        seccomp = ["--seccomp", str(self.seccomp_fd)] if self.seccomp_fd is not None else []
        return ["--info-fd", str(self.info_w), *held, *seccomp]

    def handed_over(self) -> None:
        """bwrap holds its ends now: ours of them are closed."""
        for fd in self.theirs:
            self._close(fd)

    def release(self) -> None:
        """Let the held command run (its init is confined)."""
        os.write(self.block_w, b"1")

    def _close(self, fd: int) -> None:
        if fd in self._open:
            self._open.remove(fd)
            os.close(fd)

    def close(self) -> None:
        for fd in list(self._open):
            self._close(fd)

    def __enter__(self) -> StartFds:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def command(
    prefix: Sequence[str],
    fds: StartFds,
    argv: Sequence[str],
    *,
    chdir: str,
    env: Mapping[str, str],
    as_pid_1: bool = False,
) -> list[str]:
    """bwrap's whole argv: the jail (``prefix``: launcher, bwrap and the jail's binds), the
    command's directory and environment (nothing inherited), the start's descriptors, the command."""
    env_args = [a for k, v in env.items() for a in ("--setenv", k, v)]
    pid_1 = ["--as-pid-1"] if as_pid_1 else []
    return [*prefix, *pid_1, "--chdir", chdir, "--clearenv", *env_args, *fds.args(), "--", *argv]


def not_started() -> BackendUnavailable:
    return BackendUnavailable(f"bwrap did not start the jail within {START_TIMEOUT_S:g} s", backend="bwrap")


def failed(reason: str, exit_code: int | None) -> BackendUnavailable:
    return BackendUnavailable(f"bwrap failed to start the jail: {reason}", backend="bwrap", exit_code=exit_code)


def wait_init_pid(fd: int, wait: Callable[[], int]) -> int:
    """The host pid of the jail's init, without an event loop; bwrap's stderr is the user's
    terminal, so its message is already there."""
    info = InfoReader(fd)
    deadline = time.monotonic() + START_TIMEOUT_S
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    while not info.done:
        left = deadline - time.monotonic()
        if left <= 0 or not poller.poll(left * 1000):
            raise not_started()
        info.read()
    pid = info.init_pid()
    if pid is None:
        raise failed("its own message is on stderr above", wait())
    return pid
