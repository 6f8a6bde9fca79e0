#!/usr/bin/env bash
# Make sure a Docker daemon answers: use DOCKER_HOST or the local socket if it already does,
# otherwise (as root) install docker.io if needed, start dockerd in the background and wait for
# its socket. Exit 0 when a daemon answers, 1 with the reason otherwise (callers may go on:
# docker tests then skip and say why).
#
# As root, with a local daemon, it also registers gVisor's runsc as the runtime "runsc" (the
# docker-runsc tests, [docker] runtime = "runsc"): it installs Debian's runsc package when missing,
# merges the runtime into /etc/docker/daemon.json (other keys kept; rewritten only when it differs)
# and has a running dockerd reload it (SIGHUP: runtimes are reloadable, running containers stay).
# A failure there is reported, never fatal: the docker-runsc tests then skip and say what is missing.
# SANDBOX_GVISOR=0 leaves gVisor alone; SANDBOX_RUNSC_PLATFORM picks its platform (default ptrace,
# which needs no KVM: this host's may be a PVM without VMX).
set -u
log=${DOCKERD_LOG:-/tmp/sandbox-dockerd.log}
daemon_json=${DOCKERD_CONFIG:-/etc/docker/daemon.json}
# --network=none: no network stack but loopback (gVisor's own stack cannot start on Linux >= 6.11
# with runsc releases before 2024-08, google/gvisor#10704; the jails' allowlist goes through a
# unix socket anyway); --host-uds=open: the agent's and the proxy's host sockets can be reached;
# --oci-seccomp: Docker's seccomp profile applies inside the sandbox too.
runsc_args=("--platform=${SANDBOX_RUNSC_PLATFORM:-ptrace}" "--network=none" "--host-uds=open" "--oci-seccomp")

answers() { docker version --format '{{.Server.Version}}' >/dev/null 2>&1; }

# Print "changed" when daemon.json now registers runsc as asked and did not before; "same" when it
# already did. Exit non-zero (the file untouched) when it is not JSON we can merge into.
merge_runsc() {
  python3 - "$daemon_json" "$1" "${runsc_args[@]}" <<'EOF'
import json, os, sys, tempfile
path, binary, *args = sys.argv[1:]
path = os.path.abspath(path)
try:
    with open(path, encoding="utf-8") as fh:
        config = json.load(fh)
except FileNotFoundError:
    config = {}
if not isinstance(config, dict) or not isinstance(config.get("runtimes", {}), dict):
    sys.exit(f"{path} is not a JSON object with a runtimes object")
wanted = {"path": binary, "runtimeArgs": args}
if config.get("runtimes", {}).get("runsc") == wanted:
    print("same")
    sys.exit(0)
config.setdefault("runtimes", {})["runsc"] = wanted
os.makedirs(os.path.dirname(path), exist_ok=True)
fd, temp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".daemon.json.")
with os.fdopen(fd, "w", encoding="utf-8") as fh:
    json.dump(config, fh, indent=2)
    fh.write("\n")
os.chmod(temp, 0o644)
os.replace(temp, path)
print("changed")
EOF
}

registered() { docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q '"runsc"'; }

# Whether the daemon runs runsc as daemon.json now says: the same binary, the same options.
taken() {
  local args
  args=$(printf '"%s",' "${runsc_args[@]}")
  docker info --format '{{json .Runtimes}}' 2>/dev/null \
    | grep -qF "\"runsc\":{\"path\":\"$(command -v runsc)\",\"runtimeArgs\":[${args%,}]}"
}

# Install and register runsc; print "reload" when a running dockerd must reread its configuration.
setup_gvisor() {
  [ "${SANDBOX_GVISOR:-1}" = 0 ] && return 0
  if ! command -v runsc >/dev/null 2>&1; then
    echo "dockerd-up: runsc (gVisor) is missing; installing runsc with apt-get" >&2
    if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq runsc >/dev/null; }; then
      echo "dockerd-up: cannot install runsc: the docker-runsc tests will skip" >&2
      return 0
    fi
  fi
  if ! command -v python3 >/dev/null 2>&1; then
    echo "dockerd-up: python3 is missing: cannot merge runsc into $daemon_json" >&2
    return 0
  fi
  local merged
  if ! merged=$(merge_runsc "$(command -v runsc)"); then
    echo "dockerd-up: $daemon_json left as it is: runsc is not registered" >&2
    return 0
  fi
  if [ "$merged" = changed ]; then
    echo "dockerd-up: registered runsc in $daemon_json (${runsc_args[*]})" >&2
    echo reload
  fi
}

reload_dockerd() {
  local pid
  pid=$(pgrep -o -x dockerd) || { echo "dockerd-up: no local dockerd to reload" >&2; return 1; }
  kill -HUP "$pid"
  for _ in $(seq 1 40); do
    taken && { echo "dockerd-up: dockerd reloaded, runsc is registered"; return 0; }
    sleep 0.25
  done
  echo "dockerd-up: dockerd did not take runsc within 10 s; last lines of $log:" >&2
  tail -n 5 "$log" >&2
  return 1
}

if [ -n "${DOCKER_HOST:-}" ]; then
  if command -v docker >/dev/null 2>&1 && answers; then
    echo "dockerd-up: a Docker daemon already answers at DOCKER_HOST=$DOCKER_HOST"; exit 0
  fi
  echo "dockerd-up: DOCKER_HOST=$DOCKER_HOST does not answer; not starting a local daemon" >&2; exit 1
fi
if [ "$(id -u)" != 0 ]; then
  if command -v docker >/dev/null 2>&1 && answers; then
    registered || echo "dockerd-up: runsc is not registered with this daemon (only root can do it here)" >&2
    echo "dockerd-up: a Docker daemon already answers"; exit 0
  fi
  if ! command -v dockerd >/dev/null 2>&1; then
    echo "dockerd-up: Docker is not installed: sudo apt-get install docker.io" >&2; exit 1
  fi
  echo "dockerd-up: no Docker daemon answers and only root can start one here (sudo systemctl start docker)" >&2
  exit 1
fi
if ! command -v dockerd >/dev/null 2>&1; then
  echo "dockerd-up: dockerd is missing; installing docker.io with apt-get"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io >/dev/null \
    || { echo "dockerd-up: cannot install docker.io" >&2; exit 1; }
fi
# Before dockerd starts (it then reads the file as it is), or to reload one that runs already.
gvisor=$(setup_gvisor)
if command -v docker >/dev/null 2>&1 && answers; then
  if [ "$gvisor" = reload ]; then
    reload_dockerd || true
  fi
  echo "dockerd-up: a Docker daemon already answers"; exit 0
fi
if ! pgrep -x dockerd >/dev/null; then
  nohup dockerd >"$log" 2>&1 &
fi
for _ in $(seq 1 120); do
  if [ -S /var/run/docker.sock ] && answers; then
    echo "dockerd-up: dockerd is up"; exit 0
  fi
  sleep 0.5
done
echo "dockerd-up: dockerd did not answer within 60 s; last lines of $log:" >&2
tail -n 20 "$log" >&2
exit 1
