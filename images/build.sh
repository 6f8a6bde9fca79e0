#!/usr/bin/env bash
# `make image`: build sandbox-runtime:<version> through the docker SDK (see images/build.py):
# online from debian:bookworm-slim when it is present or pullable, else offline from a cached
# debootstrap rootfs. Idempotent: returns at once when the image is current.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-$here/../.venv/bin/python}
[ -x "$py" ] || py=python3
if ! "$py" -c 'import docker' 2>/dev/null; then
  echo "image: $py has no docker SDK; run 'make setup' (or pip install 'docker>=7.1') first" >&2
  exit 1
fi
exec "$py" "$here/build.py" "$@"
