#!/usr/bin/env bash
# The bubblewrap suite as an ordinary user, the way a developer without root runs it: no cgroup
# delegation, no overlay mounts, the kernel's per-user limits. Run as root; it
#   1. creates the user (SANDBOX_CI_USER, default sandboxci) if missing;
#   2. copies the checkout to a directory that user owns (the checkout may live under /root);
#   3. builds a venv owned by the user with /usr/bin/python3 and installs '<copy>[dev]' into it;
#   4. runs pytest as that user, with runuser, on a copy of tests/ outside the checkout copy, so
#      the installed package is what is tested: -m "not docker and not root".
# Usage: tests/run-as-user.sh CHECKOUT [PYTEST ARGS...]; exits with pytest's status (5, no tests
# collected, is a failure).
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 CHECKOUT [PYTEST ARGS...]" >&2; exit 2; }
checkout=$(cd "$1" && pwd)
shift
[ "$(id -u)" -eq 0 ] || { echo "run-as-user: must run as root (it creates the user)" >&2; exit 2; }
user=${SANDBOX_CI_USER:-sandboxci}
say() { printf 'run-as-user: %s\n' "$*" >&2; }
as_user() { runuser -u "$user" -- "$@"; }

if ! id -u "$user" >/dev/null 2>&1; then
  say "creating user $user"
  useradd --create-home --shell /bin/bash "$user"
fi
home=$(getent passwd "$user" | cut -d: -f6)
work="$home/sandbox-ci"   # not /tmp: every jail gets a private /tmp
rm -rf "$work"
install -d -o "$user" -g "$(id -gn "$user")" -m 0700 "$work" "$work/src" "$work/run"

say "copying $checkout for $user"
tar -C "$checkout" --exclude=./.git --exclude=./.venv --exclude='*/node_modules' --exclude=./bench/.peers \
    --exclude='*/__pycache__' --exclude='*.egg-info' --exclude=./build --exclude=./dist \
    --exclude=./.mypy_cache --exclude=./.ruff_cache --exclude=./.pytest_cache --exclude=./images/.cache -cf - . \
  | as_user tar -C "$work/src" -xf -
as_user cp -r "$work/src/tests" "$work/run/tests"
# Checkout files some tests read beside tests/ (never the package: that is the installed one);
# .cache/fixtures: the packages `make test-fixtures` fetched, served by tests/registries.py.
for extra in images README.md docs mkdocs.yml integrations/protocol.schema.json integrations/pi/src/protocol.ts .cache/fixtures; do
  if [ -e "$work/src/$extra" ]; then (cd "$work/src" && as_user cp -r --parents "$extra" "$work/run/"); fi
done
# The suite's pytest settings, with nothing of the checkout on sys.path.
sed -n '/^\[tool.pytest.ini_options\]/,/^\[/p' "$checkout/pyproject.toml" | sed '$d' \
  | as_user tee "$work/run/pyproject.toml" >/dev/null

say "building a venv for $user with /usr/bin/python3"
as_user /usr/bin/python3 -m venv "$work/venv"
as_user "$work/venv/bin/pip" install -q "$work/src[dev]" 2>&1 | grep -v '^WARNING: Location' || true
cd "$work/run"
where=$(as_user "$work/venv/bin/python" -c 'import sandbox, sys; sys.stdout.write(sandbox.__file__)')
case "$where" in
  "$work/venv/"*) say "testing the installed package at $where" ;;
  *) say "the tests would import sandbox from $where, not from the installed package"; exit 1 ;;
esac

# The microVM's kernel, initramfs and root file system root built (`make microvm`), read in place
# (the root file system holds device nodes an ordinary user could not copy); else its tests skip, saying so.
cache=()
if as_user test -r "$checkout/images/.cache/microvm" -a -x "$checkout/images/.cache/microvm"; then
  cache=(SANDBOX_IMAGE_CACHE="$checkout/images/.cache")
fi

say "running pytest as $(as_user id)"
started=$(date +%s)
set +e
as_user env -u SANDBOX_DATA_DIR HOME="$home" "${cache[@]}" "$work/venv/bin/python" -m pytest -p no:cacheprovider \
  -m "not docker and not root and not soak and not npm and not wine" "$@" tests
rc=$?
set -e
say "pytest exited $rc after $(( $(date +%s) - started )) s"
[ $rc -ne 5 ] || { say "pytest collected no tests"; exit 1; }
exit $rc
