#!/usr/bin/env bash
# The docker backend against Podman's Docker-compatible API, as root and rootless (issue 17, part 2).
# Podman stays beside dockerd: its own store (/var/lib/containers, ~/.local/share/containers), its
# own sockets, no docker0, no DOCKER chains (our containers use network "none"; a profile with
# network.mode = "host" puts one on Podman's own bridge, podman0 and its NETAVARK chains).
#
#   --setup       as root, idempotent: apt-get install podman uidmap slirp4netns fuse-overlayfs
#                 (refused if apt would remove a package, docker.io say); the CI user (created as
#                 tests/run-as-user.sh does) with subordinate uid/gid ranges and an overlay store;
#                 then --start and --load-image.
#   --start       start the API services if they do not answer: root's on $PODMAN_ROOT_SOCK
#                 (/run/podman/podman.sock) and the user's on $XDG_RUNTIME_DIR/podman/podman.sock,
#                 XDG_RUNTIME_DIR=/run/user/<uid> made by hand (no systemd, no logind here).
#   --stop        stop the services --start started (their pid files), nothing else.
#   --load-image  `docker save` the sandbox images dockerd has (make image) into both Podman stores,
#                 unless they hold the same image id already.
#   --test [PYTEST ARGS]       the docker-marked suite as root against root Podman.
#   --test-user [PYTEST ARGS]  the same suite as the CI user against rootless Podman, through
#                 tests/run-as-user.sh (its copy, its venv: the installed package is tested).
# The suite: the contract and attack tests, the leak tests, the limits, the streams and
# tests/integration/test_podman.py (which skips, naming what is missing, without a Podman socket).
# Exit status: pytest's (5, no tests collected, is a failure); 2 for a usage or set-up error.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
user=${SANDBOX_CI_USER:-sandboxci}
root_sock=${PODMAN_ROOT_SOCK:-/run/podman/podman.sock}
logs=${PODMAN_LOG_DIR:-/var/log/sandbox-podman}
SUITE=(tests/integration/test_contracts.py tests/integration/test_leaks.py tests/integration/test_limits.py
       tests/integration/test_docker_streams.py tests/integration/test_podman.py)
PACKAGES=(podman uidmap slirp4netns fuse-overlayfs)

say() { printf 'run-podman: %s\n' "$*" >&2; }
die() { say "$*"; exit 2; }
need_root() { [ "$(id -u)" -eq 0 ] || die "$1 must run as root"; }
uid_of() { id -u "$user"; }
user_runtime() { printf '/run/user/%s' "$(uid_of)"; }
user_sock() { printf '%s/podman/podman.sock' "$(user_runtime)"; }
as_user() { runuser -u "$user" -- env HOME="$(getent passwd "$user" | cut -d: -f6)" XDG_RUNTIME_DIR="$(user_runtime)" "$@"; }
version() { sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$root/sandbox/__init__.py"; }

# Whether a Docker-compatible API answers on a unix socket (stdlib only: no curl on a fresh host).
answers() {
  python3 - "$1" <<'EOF'
import socket, sys
try:
    s = socket.socket(socket.AF_UNIX); s.settimeout(3); s.connect(sys.argv[1])
    s.sendall(b"GET /_ping HTTP/1.0\r\nHost: d\r\n\r\n"); ok = s.recv(64).split(b" ")[1] == b"200"
except (OSError, IndexError):
    ok = False
sys.exit(0 if ok else 1)
EOF
}

install_packages() {
  local missing=() pkg
  for pkg in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
  done
  [ ${#missing[@]} -gt 0 ] || { say "installed already: ${PACKAGES[*]}"; return; }
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # Never at dockerd's expense: a plan that removes anything (docker.io, containerd, runc) stops here.
  local removed
  removed=$(apt-get install -s -y "${missing[@]}" | sed -n 's/^Remv \([^ ]*\).*/\1/p' | tr '\n' ' ')
  [ -z "$removed" ] || die "installing ${missing[*]} would remove: $removed; not done"
  say "installing ${missing[*]}"
  apt-get install -y -qq "${missing[@]}" >/dev/null
}

create_user() {  # as tests/run-as-user.sh does
  if ! id -u "$user" >/dev/null 2>&1; then
    say "creating user $user"
    useradd --create-home --shell /bin/bash "$user"
  fi
}

# Subordinate ranges for rootless Podman: 65536 ids after the highest range already given.
ids_added=0
subordinate_ids() {
  local file flag start
  for file in /etc/subuid /etc/subgid; do
    [ -e "$file" ] || touch "$file"
    grep -q "^$user:" "$file" && continue
    start=$(awk -F: 'BEGIN {m = 100000} {e = $2 + $3; if (e > m) m = e} END {print m}' "$file")
    flag=--add-subuids; [ "$file" = /etc/subgid ] && flag=--add-subgids
    say "giving $user $file range $start-$((start + 65535))"
    usermod "$flag" "$start-$((start + 65535))" "$user"
    ids_added=1
  done
}

# The user's store on the kernel's own overlay (unprivileged since Linux 5.13): vfs, Podman's
# fallback, copies the whole image for every container; fuse-overlayfs needs /dev/fuse.
user_storage() {
  local home conf driver
  home=$(getent passwd "$user" | cut -d: -f6)
  conf="$home/.config/containers/storage.conf"
  install -d -o "$user" -g "$(id -gn "$user")" -m 0700 "$(user_runtime)"
  if [ ! -e "$conf" ]; then
    as_user mkdir -p "$(dirname "$conf")"
    printf '[storage]\ndriver = "overlay"\n' | as_user tee "$conf" >/dev/null
  fi
  driver=$(cd / && as_user podman info --format '{{.Store.GraphDriverName}}' 2>/dev/null || true)
  if [ "$driver" != overlay ] && [ -z "$(cd / && as_user podman images -q 2>/dev/null)" ]; then
    say "the $user store was made with '${driver:-?}'; resetting the empty store to overlay"
    (cd / && as_user podman system reset -f >/dev/null 2>&1) || true
  fi
  # New ranges reach Podman's user namespace only after a migrate, which stops the user's
  # containers: only when the ranges are new.
  if [ $ids_added -eq 1 ]; then (cd / && as_user podman system migrate >/dev/null 2>&1) || true; fi
}

start_service() {  # WHO SOCKET: start `podman system service` unless the socket answers
  local who=$1 sock=$2 pidfile="$logs/$1-service.pid"
  if answers "$sock"; then say "$who Podman answers on $sock"; return; fi
  mkdir -p "$logs"
  if [ "$who" = root ]; then
    install -d -m 0755 "$(dirname "$sock")"
    (cd / && exec setsid podman system service --time=0 "unix://$sock" </dev/null >"$logs/root.log" 2>&1) &
  else
    as_user mkdir -p "$(dirname "$sock")"
    (cd / && exec setsid runuser -u "$user" -- env HOME="$(getent passwd "$user" | cut -d: -f6)" \
      XDG_RUNTIME_DIR="$(user_runtime)" podman system service --time=0 "unix://$sock" \
      </dev/null >"$logs/$who.log" 2>&1) &
  fi
  echo $! >"$pidfile"
  local i
  for i in $(seq 100); do answers "$sock" && { say "$who Podman started on $sock"; return; }; sleep 0.2; done
  die "$who Podman did not answer on $sock; see $logs/$who.log"
}

start() {
  need_root --start
  start_service root "$root_sock"
  start_service user "$(user_sock)"
}

stop() {
  local who pid
  for who in root user; do
    [ -e "$logs/$who-service.pid" ] || continue
    pid=$(cat "$logs/$who-service.pid")
    if kill "$pid" 2>/dev/null; then say "stopped the $who service (pid $pid)"; fi
    rm -f "$logs/$who-service.pid"
  done
}

# docker save | podman load, for each sandbox image dockerd has that a Podman store lacks.
load_image() {
  need_root --load-image
  command -v docker >/dev/null || die "no docker client to save the image from; build it with make image"
  local v ref want have found=0
  v=$(version)
  for ref in "sandbox-runtime:$v" "sandbox-runtime:$v-node" "sandbox-runtime:node"; do
    want=$(docker image inspect --format '{{.Id}}' "$ref" 2>/dev/null) || continue
    found=1
    want=${want#sha256:}
    have=$(cd / && podman image inspect --format '{{.Id}}' "$ref" 2>/dev/null || true)
    if [ "$have" = "$want" ]; then say "root Podman has $ref"; else
      say "loading $ref into root Podman"; docker save "$ref" | (cd / && podman load -q) >/dev/null
    fi
    have=$(cd / && as_user podman image inspect --format '{{.Id}}' "$ref" 2>/dev/null || true)
    if [ "$have" = "$want" ]; then say "$user's Podman has $ref"; else
      say "loading $ref into $user's Podman"; docker save "$ref" | (cd / && as_user podman load -q) >/dev/null
    fi
  done
  [ $found -eq 1 ] || die "dockerd has no sandbox-runtime:$v: run make image first"
}

setup() {
  need_root --setup
  install_packages
  create_user
  subordinate_ids
  user_storage
  start
  load_image
}

run_tests() {  # as root, against root Podman
  need_root --test
  answers "$root_sock" || die "root Podman does not answer on $root_sock: run $0 --setup"
  cd "$root"
  set +e
  DOCKER_HOST="unix://$root_sock" "$root/.venv/bin/python" -m pytest -p no:cacheprovider -m docker \
    "$@" "${SUITE[@]}"
  local rc=$?
  set -e
  [ $rc -ne 5 ] || { say "pytest collected no tests"; exit 1; }
  return $rc
}

run_user_tests() {  # as the CI user, against rootless Podman, on the installed package
  need_root --test-user
  local sock keyword
  sock=$(user_sock)
  answers "$sock" || die "$user's Podman does not answer on $sock: run $0 --setup"
  # run-as-user.sh runs its tests/ copy whole: -m and -k narrow it to this suite.
  keyword=$(printf '%s\n' "${SUITE[@]}" | sed 's|.*/||; s|\.py$||' | paste -sd' ' | sed 's/ / or /g')
  DOCKER_HOST="unix://$sock" SANDBOX_CI_USER="$user" bash "$here/run-as-user.sh" "$root" \
    -m docker -k "$keyword" "$@"
}

case "${1:-}" in
  --setup) setup ;;
  --start) start ;;
  --stop) need_root --stop; stop ;;
  --load-image) load_image ;;
  --test) shift; run_tests "$@" ;;
  --test-user) shift; run_user_tests "$@" ;;
  *) die "usage: $0 --setup | --start | --stop | --load-image | --test [PYTEST ARGS] | --test-user [PYTEST ARGS]" ;;
esac
