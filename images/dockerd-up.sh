#!/usr/bin/env bash
# Make sure a Docker daemon answers: use DOCKER_HOST or the local socket if it already does,
# otherwise (as root) install docker.io if needed, start dockerd in the background and wait for
# its socket. Exit 0 when a daemon answers, 1 with the reason otherwise (callers may go on:
# docker tests then skip and say why).
set -u
log=${DOCKERD_LOG:-/tmp/sandbox-dockerd.log}

answers() { docker version --format '{{.Server.Version}}' >/dev/null 2>&1; }

if command -v docker >/dev/null 2>&1 && answers; then
  echo "dockerd-up: a Docker daemon already answers"; exit 0
fi
if [ -n "${DOCKER_HOST:-}" ]; then
  echo "dockerd-up: DOCKER_HOST=$DOCKER_HOST does not answer; not starting a local daemon" >&2; exit 1
fi
if [ "$(id -u)" != 0 ]; then
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
