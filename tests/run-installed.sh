#!/usr/bin/env bash
# What a user installs, tested: build the wheel, install it into a fresh venv outside the
# checkout, then run against that installed `sandbox` (never the checkout's code):
#   1. the CLI and backend contract tests, from a copy of tests/ in a directory with no sandbox/;
#   2. the README's Python example, extracted from README.md as written;
#   3. the pi extension's Node tests, with SANDBOX_BIN pointing at the installed console script.
# Usage: tests/run-installed.sh [CHECKOUT]   (PYTHON picks the interpreter; default python3)
set -euo pipefail
checkout=$(cd "${1:-$(dirname "$0")/..}" && pwd)
python=${PYTHON:-python3}
work=$(mktemp -d /var/tmp/sandbox-installed.XXXXXX)   # not /tmp: the jail has a private /tmp
trap 'rm -rf "$work"' EXIT
say() { printf 'installed: %s\n' "$*" >&2; }

say "building the wheel"
"$python" -m pip wheel -q --no-deps -w "$work/dist" "$checkout" 2>&1 | grep -v '^WARNING: Location' || true
wheel=$(ls "$work"/dist/*.whl)
say "installing $(basename "$wheel") into a fresh venv"
"$python" -m venv "$work/venv"
"$work/venv/bin/pip" install -q "$wheel[docker]" pytest pytest-timeout 2>&1 | grep -v '^WARNING: Location' || true

mkdir -p "$work/t"
# The tests without the npm clients they drive elsewhere (tests/agents: 1.3 GB; none run here).
mkdir -p "$work/t/tests"
tar -C "$checkout/tests" --exclude='*/node_modules' --exclude='*/__pycache__' -cf - . | tar -C "$work/t/tests" -xf -
# The suite's pytest settings, with nothing of the checkout on sys.path.
sed -n '/^\[tool.pytest.ini_options\]/,/^\[/p' "$checkout/pyproject.toml" | sed '$d' > "$work/t/pyproject.toml"
cd "$work/t"
where=$("$work/venv/bin/python" -c 'import sandbox, sys; sys.stdout.write(sandbox.__file__)')
case "$where" in
  "$work/venv/"*) say "testing the installed package at $where" ;;
  *) say "the tests would import sandbox from $where, not from the installed wheel"; exit 1 ;;
esac
"$work/venv/bin/sandbox" profiles >/dev/null
[ -n "$("$work/venv/bin/sandbox" profiles)" ] || { say "the installed wheel ships no profiles"; exit 1; }

set +e
"$work/venv/bin/python" -m pytest -q -p no:cacheprovider tests/integration/test_cli_run.py \
  tests/integration/test_contracts.py ${INSTALLED_PYTEST_ARGS:-}
rc=$?
set -e
[ $rc -eq 5 ] && { say "pytest ran no tests"; exit 1; }
[ $rc -eq 0 ] || exit $rc

say "running the README's Python example"
"$work/venv/bin/python" "$checkout/tests/readme_example.py" "$checkout/README.md" "$work"

if [ "${SKIP_PI:-}" != 1 ]; then
  say "running the pi extension's tests against the installed sandbox"
  (cd "$checkout/integrations/pi" && npm ci --no-audit --no-fund >/dev/null && SANDBOX_BIN="$work/venv/bin/sandbox" npm test)
fi
say "ok"
