"""gVisor as the Docker jail's runtime, read from ``docker info`` as an engine answers it (no daemon).

The runtime a profile names is the engine's by name or refused, never the default instead (on
Podman, whose compatible API ignores a container's runtime, any name but its default is refused);
a report for runc withholds ``kernel-isolated`` with the reason, one for gVisor grants it and says
what changes (the limits that end the sandbox, the one it cannot hold, the link, the network).
"""

from __future__ import annotations

from typing import Any

import pytest

from sandbox.backends.docker import gvisor
from sandbox.errors import BackendUnavailable, InvalidArgument
from sandbox.guarantees import Report
from tests.conftest import make_profile

RUNSC_ARGS = ["--platform=ptrace", "--network=none", "--host-uds=open", "--oci-seccomp"]
INFO: dict[str, Any] = {
    "DefaultRuntime": "runc",
    "Runtimes": {
        "runc": {"path": "runc"},
        "runsc": {"path": "/usr/bin/runsc", "runtimeArgs": RUNSC_ARGS},
        "gvisor-kvm": {"path": "/usr/local/bin/runsc", "runtimeArgs": ["--platform", "kvm"]},
    },
}


def _report() -> Report:
    report = Report("docker", True)
    for name in ("seccomp", "memory-limit", "pids-limit", "cpu-limit", "net-transparent"):
        report.grant(name, True)
    return report


def test_the_engines_default_runtime_is_runc_and_not_kernel_isolated() -> None:
    choice = gvisor.resolve(INFO, None)
    assert (choice.name, choice.gvisor, choice.named) == ("runc", False, False)
    report = _report()
    gvisor.apply(report, choice)
    assert report.missing(("kernel-isolated",)) == {
        "kernel-isolated": "commands make system calls to the host's kernel (runc)"
    }
    assert report.notes == [] and report.guarantees["seccomp"]


def test_runsc_is_gvisor_with_its_options_read_back() -> None:
    choice = gvisor.resolve(INFO, "runsc")
    assert choice.gvisor and choice.named
    assert (choice.platform, choice.network, choice.host_uds, choice.oci_seccomp) == ("ptrace", "none", "open", True)
    other = gvisor.resolve(INFO, "gvisor-kvm")  # gVisor by its binary, whatever the engine calls it
    assert other.gvisor and other.platform == "kvm" and other.network == "sandbox" and other.host_uds == "none"
    assert not other.oci_seccomp


def test_a_runtime_the_engine_does_not_know_is_refused_with_what_it_has() -> None:
    with pytest.raises(BackendUnavailable) as refused:
        gvisor.resolve(INFO, "kata")
    assert "no runtime of that name (it has: gvisor-kvm, runc, runsc)" in refused.value.message
    assert refused.value.data["runtime"] == "kata"
    with pytest.raises(BackendUnavailable) as unregistered:
        gvisor.resolve({"Runtimes": {"runc": {"path": "runc"}}}, "runsc")
    assert "daemon.json" in unregistered.value.message and "dockerd-up.sh" in unregistered.value.message


def test_podman_refuses_a_runtime_it_would_ignore_and_takes_its_default() -> None:
    podman = {"DefaultRuntime": "crun", "Runtimes": {"crun": {"path": "/usr/bin/crun"}, "runsc": {"path": "runsc"}}}
    with pytest.raises(BackendUnavailable) as refused:
        gvisor.resolve(podman, "runsc", podman=True)
    assert "ignores a container's runtime" in refused.value.message and "containers.conf" in refused.value.message
    assert gvisor.resolve({**podman, "DefaultRuntime": "runsc"}, "runsc", podman=True).gvisor
    assert not gvisor.resolve(podman, None, podman=True).gvisor


def test_a_gvisor_report_grants_kernel_isolation_and_says_what_changes() -> None:
    report = _report()
    gvisor.apply(report, gvisor.resolve(INFO, "runsc"))
    assert report.guarantees["kernel-isolated"] and report.guarantees["seccomp"]  # --oci-seccomp
    assert not report.guarantees["cpu-limit"] and not report.guarantees["net-transparent"]
    assert report.limits["cpu_time_s"].how is None and "RLIMIT_CPU" in report.limits["cpu_time_s"].why_not
    assert "whole sandbox" in str(report.limits["memory"].how) and "whole sandbox" in str(report.limits["pids"].how)
    assert any("Sentry" in note and "user-space kernel" in note for note in report.notes)
    assert any("--network=none" in note for note in report.notes)
    # A profile that sets cpu_time_s is refused; one at the schema's default is best effort.
    assert "limits.cpu_time_s" in report.refused_limits(make_profile(**{"limits.cpu_time_s": 60}))
    assert report.refused_limits(make_profile(**{"limits.cpu_time_s": 300})) == {}


def test_without_oci_seccomp_the_engines_profile_is_not_claimed() -> None:
    report = _report()
    gvisor.apply(report, gvisor.resolve(INFO, "gvisor-kvm"))
    assert not report.guarantees["seccomp"] and "--oci-seccomp" in report.reasons["seccomp"]


def test_the_agent_link_needs_host_sockets() -> None:
    assert gvisor.socket_refusal(gvisor.resolve(INFO, "runsc")) is None
    assert gvisor.socket_refusal(gvisor.resolve(INFO, "runc")) is None
    refusal = gvisor.socket_refusal(gvisor.resolve(INFO, "gvisor-kvm"))
    assert refusal is not None and "--host-uds=open" in refusal


def test_what_gvisor_cannot_give_a_profile_is_refused() -> None:
    runsc = gvisor.resolve(INFO, "runsc")
    with pytest.raises(InvalidArgument) as host:
        gvisor.refusal(make_profile(**{"network.mode": "host"}), runsc)
    assert host.value.data["key"] == "network.mode" and "--network=none" in host.value.message
    gvisor.refusal(make_profile(**{"network.mode": "host"}), gvisor.resolve(INFO, "gvisor-kvm"))  # its own stack
    gvisor.refusal(make_profile(**{"network.mode": "host"}), gvisor.resolve(INFO, None))  # runc: anything goes
    gvisor.refusal(make_profile(), runsc)


def test_the_runtime_setting_is_a_name_and_passed_to_the_engine(tmp_path: Any) -> None:
    from sandbox.backends.docker.config import container_config

    with pytest.raises(InvalidArgument):
        make_profile(**{"docker.runtime": "runsc --debug"})
    ws = tmp_path / "ws"
    ws.mkdir()
    named = container_config(make_profile(**{"docker.runtime": "runsc"}), "j", ws, ws, agent_user="1000:1000")
    assert named["runtime"] == "runsc"
    assert "runtime" not in container_config(make_profile(), "j", ws, ws, agent_user="1000:1000")


def test_check_says_in_a_line_whether_runsc_is_installed_and_registered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gvisor, "installed", lambda: {"path": "/usr/bin/runsc", "version": "0.0~20221219.0"})
    line = gvisor.status(gvisor.describe(INFO, None))
    assert line.startswith("gVisor: runsc 0.0~20221219.0 is installed (/usr/bin/runsc), registered with the engine as")
    assert "runsc: platform ptrace, network none, host sockets open, the engine's seccomp profile inside" in line
    assert "gvisor-kvm: platform kvm, network sandbox, host sockets none" in line
    monkeypatch.setattr(gvisor, "installed", dict)
    assert gvisor.status(gvisor.describe({"Runtimes": {"runc": {}}}, None)) == (
        'gVisor: runsc is not installed here, not registered with the engine ([docker] runtime = "runsc" is refused)'
    )
    remote = gvisor.describe(INFO, "the engine at tcp://x:2376 is reached over tcp://")
    assert remote["installed"] == "unknown: the engine at tcp://x:2376 is reached over tcp://"
