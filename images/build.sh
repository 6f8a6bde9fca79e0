#!/usr/bin/env bash
# `make image`: the same code as `sandbox image build` (sandbox/image.py), run from this checkout:
# sandbox-runtime:<version> online from debian:bookworm-slim when it is present or pullable, else
# offline from a debootstrap rootfs cached in images/.cache/. Arguments go to the command
# (--variant node, --force, --mode offline). Idempotent: returns at once when the image is current.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
py=${PYTHON:-$root/.venv/bin/python}
[ -x "$py" ] || py=python3
if ! "$py" -c 'import docker' 2>/dev/null; then
  echo "image: $py has no docker SDK; run 'make setup' (or pip install 'docker>=7.1') first" >&2
  exit 1
fi
export SANDBOX_IMAGE_CACHE=${SANDBOX_IMAGE_CACHE:-$here/.cache}
export PYTHONPATH=$root${PYTHONPATH:+:$PYTHONPATH}
exec "$py" -m sandbox.cli image build "$@"
