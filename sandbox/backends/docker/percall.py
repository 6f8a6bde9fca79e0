"""The per-call Docker jail: a container of its own for every call (``lifecycle = "call"``).

tini runs ``sleep infinity`` as a *keeper* uid (65534); the call is one ``docker exec`` as the
command uid, wrapped so that ``kill -KILL -1`` removes whatever it left behind, and the
container is removed afterwards: removing it kills everything in its pid namespace. Its output
comes through a :class:`~sandbox.backends.docker.streams.Pump`.
"""

from __future__ import annotations

import contextlib
import math
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
import docker
import docker.errors

from sandbox.backends.base import Process
from sandbox.backends.docker.client import quietly, run_sync
from sandbox.backends.docker.jail import DockerJail
from sandbox.backends.docker.runtime import Runtime
from sandbox.backends.docker.streams import Pump
from sandbox.backends.environment import base_env
from sandbox.errors import BackendUnavailable

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from sandbox.backends.base import Stdin

# Runs the command, then kills whatever it left behind, so a background process holding the
# output open cannot keep the exec running (kill is a shell builtin: no fork, and kill -1 spares
# the shell itself). The kill before it is insurance only: a per-call container is fresh.
WRAPPER = 'kill -KILL -1 2>/dev/null; mkdir -p "$HOME" 2>/dev/null; "$@"; rc=$?; kill -KILL -1 2>/dev/null; exit $rc'
# Execute-only copy of dash in the image: non-dumpable, so the call cannot ptrace its wrapper.
WRAPPER_SHELL = "/usr/local/bin/sandbox-sh"

# The tree kill of a call that has a grace (a timeout, an abort): TERM, up to $1 ticks of grace,
# KILL until ps shows nothing of this uid but the sweep itself; then the memory cgroup's
# oom_kill count (v1 or v2 file, whichever the container shows).
# Why in sh, a kill of its own: the container runs no Python of ours (tini and sleep as the
# keeper uid), and the sweep must run inside its pid namespace as the command uid for
# ``kill -1`` to reach exactly the call's processes. The host cannot signal them by pid, and
# removing the container (the kill without grace) gives TERM-handling commands no grace.
SWEEP = r"""
u=$(id -u); ticks=$1
others() {
  ps -u "$u" -o pid=,ppid=,stat= | awk -v me=$$ '$1 != me && $2 != me && $3 !~ /^Z/ {f=1} END {exit !f}'
}
if [ "$ticks" -gt 0 ]; then
  kill -TERM -1 2>/dev/null
  i=0; while [ "$i" -lt "$ticks" ] && others; do sleep 0.02; i=$((i+1)); done
fi
n=0
while others; do
  kill -KILL -1 2>/dev/null; n=$((n+1)); [ "$n" -gt 400 ] && exit 3; sleep 0.005
done
cat /sys/fs/cgroup/memory/memory.oom_control /sys/fs/cgroup/memory.events 2>/dev/null \
  | awk '$1 == "oom_kill" {print "oom_kill", $2; exit}'
exit 0
"""


@dataclass
class Sweep:
    ok: bool
    oom_kills: int | None = None
    detail: str = ""


def sweep(runtime: Runtime, grace: float) -> Sweep:
    """Run :data:`SWEEP` in the call's container as the command uid (blocking)."""
    ticks = math.ceil(grace / 0.02) if grace > 0 else 0
    code, out = runtime.exec_output(["/bin/sh", "-c", SWEEP, "sweep", str(ticks)], runtime.user)
    if code != 0:
        return Sweep(False, detail=f"sweep exit {code}: {out.strip()[:200]}")
    counts = [int(line.split()[1]) for line in out.splitlines() if line.startswith("oom_kill ")]
    return Sweep(True, counts[0] if counts else None)


class PerCallProcess(Process):
    """One call of a per-call container: an exec there; killed by sweeping its uid out, then removing it."""

    def __init__(self, runtime: Runtime, exec_id: str, pump: Pump, on_done: Callable[[PerCallProcess], None]) -> None:
        self.runtime = runtime
        self.exec_id = exec_id
        self._pump = pump
        self.stdout = pump.stdout
        self.stderr = pump.stderr
        self._on_done = on_done
        self._oom_before = runtime.oom_kills
        self._oom = False
        self._swept = False
        self._killing = False
        self.stdin_data: Stdin = None
        self.returncode: int | None = None

    async def feed_stdin(self) -> None:
        if self.stdin_data is None or isinstance(self.stdin_data, bytes):
            await run_sync("cannot write the call's stdin", self._pump.feed, self.stdin_data or b"")
        else:
            await self._pump.stream(self.stdin_data)

    async def wait(self) -> int:
        if self.returncode is not None:
            return self.returncode
        await self._pump.done.wait()
        if self._killing and self._swept:
            # We removed its container (timeout, abort): the exec's status went with it.
            self.returncode = -9
            return self.returncode
        code = await run_sync("cannot read the call's exit status", self.runtime.exit_code, self.exec_id)
        if code is None:
            raise BackendUnavailable(
                "the Docker daemon stopped answering during the call", backend="docker", container=self.runtime.id
            )
        if code == 137 and not self._killing:
            await self._check_container(code)
        self.returncode = code
        return code

    async def _check_container(self, code: int) -> None:
        """An exit by SIGKILL we did not send: was the whole container killed from outside?"""
        killed, oom = await run_sync("cannot inspect the container", self.runtime.killed_from_outside)
        if not killed:
            return
        self._oom = oom
        self.runtime.removed = True  # auto-remove takes it away; the next call gets a new one
        self._swept = True  # nothing is left: the container is gone
        raise BackendUnavailable(
            f"the container {self.runtime.id[:12]} was killed from outside "
            f"({'out of memory' if oom else 'docker kill or stop'}); the call's exit status was {code}",
            backend="docker",
            container=self.runtime.id,
            exit_code=code,
            oom_killed=oom,
        )

    async def kill_tree(self, grace: float) -> None:
        if self._swept:
            return
        self._killing = True
        with anyio.CancelScope(shield=True):
            await self._sweep(grace)

    async def _sweep(self, grace: float) -> None:
        if grace == 0 and self.returncode != 137:
            # This call's own container: stopping its init kills everything in its pid
            # namespace; the daemon then deletes it by itself (auto-remove), off our clock.
            await run_sync("cannot stop the call's container", self.runtime.kill)
            self._swept = True
            self._finish()
            return
        try:
            result = await run_sync("cannot kill the call's processes", sweep, self.runtime, grace)
        except BackendUnavailable:
            if not await self._container_gone():
                raise
            result = Sweep(True)
        if result.oom_kills is not None:
            self._oom = result.oom_kills > self._oom_before
            self.runtime.oom_kills = result.oom_kills
        # The container is this call's alone: removing it kills everything in its pid namespace.
        await run_sync("cannot remove the call's container", self.runtime.remove)
        self._swept = True
        self._finish()

    async def _container_gone(self) -> bool:
        with contextlib.suppress(BackendUnavailable):
            return not await run_sync("cannot inspect the container", self.runtime.alive)
        return False

    def running_pids(self) -> list[int]:
        if self._swept:
            return []
        with contextlib.suppress(docker.errors.DockerException, OSError):
            return self.runtime.running()
        return []

    def oom_killed(self) -> bool:
        return self._oom

    def release(self) -> None:
        self._pump.close()
        if not self._swept:
            threading.Thread(target=quietly, args=(self.runtime.remove,), daemon=True).start()
        self._finish()

    def _finish(self) -> None:
        self._on_done(self)


class PerCallJail(DockerJail):
    """A container per call: created at ``spawn``, removed once the call is over."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._live: set[PerCallProcess] = set()

    async def _start(
        self, argv: Sequence[str], *, env: Mapping[str, str] | None, cwd: str | None, stdin: Stdin
    ) -> PerCallProcess:
        runtime = await run_sync(
            "cannot start the jail's container", Runtime.create, self.client, self._config, self.user
        )
        async with contextlib.AsyncExitStack() as cleanup_on_fail:
            cleanup_on_fail.push_async_callback(_remove, runtime)
            await self._way_out(runtime)
            proc = await self._exec(runtime, argv, env, cwd, stdin)
            cleanup_on_fail.pop_all()
        return proc

    async def _exec(
        self, runtime: Runtime, argv: Sequence[str], env: Mapping[str, str] | None, cwd: str | None, stdin: Stdin
    ) -> PerCallProcess:
        cmd = [WRAPPER_SHELL, "-c", WRAPPER, "sandbox", *argv]
        exec_id, sock = await run_sync(
            "cannot start the command in the container",
            runtime.exec_start,
            cmd,
            base_env(self.profile, env, workspace=self.workspace),
            cwd or str(self.workspace),
            stdin is not None,
        )
        proc = PerCallProcess(runtime, exec_id, Pump(sock), self._live.discard)
        proc.stdin_data = stdin
        self._live.add(proc)
        return proc

    def _release_calls(self) -> None:
        for proc in list(self._live):
            proc.release()


async def _remove(runtime: Runtime) -> None:
    """Remove a call's container whose start failed; shielded, so a cancelled start leaves none."""
    with anyio.CancelScope(shield=True):
        await run_sync("cannot remove the call's container", runtime.remove)
