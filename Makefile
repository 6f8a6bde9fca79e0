# Two commands set up everything on a fresh Debian machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
APT    := DEBIAN_FRONTEND=noninteractive apt-get install -y -qq
PYTEST_ARGS ?=
# make test's pytest workers (pytest-xdist, a test file per worker: its fixtures and its order stay
# together). Most of the suite waits on jails, daemons and guests, so two workers on two cores halve
# its wall time; PYTEST_WORKERS=0 runs it in one process.
PYTEST_WORKERS ?= 2
XDIST  := -n $(PYTEST_WORKERS) --dist loadfile

.PHONY: setup system-deps node-deps mcp-inspector agents demo docs test test-fixtures test-wine test-installed test-user test-unit test-pi soak bench lint image microvm docker-up compare schema clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c "import ensurepip, venv" 2>/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && $(APT) python3-venv; \
	  else echo "python3-venv is missing: sudo apt-get install python3-venv" >&2; exit 1; fi; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

# bubblewrap is the embedded default; Debian's python3-venv makes the venvs the installed-wheel,
# ordinary-user and README tests build with /usr/bin/python3 (an interpreter the jail can see).
# curl, git and pip are the clients the allowlist network tests drive in a bubblewrap jail (which
# shows the host's /usr); as root, nftables makes the transparent network (its rules in each
# call's own network namespace). libseccomp2 builds the jail's seccomp filter; gcc compiles the
# seccomp tests' C probes and is one of the ordinary workloads that must still run under it. A JDK
# is the secret broker's tool with a trust store of its own (Java reads no CA bundle variable).
system-deps:
	@missing=""; command -v bwrap >/dev/null 2>&1 || missing="bubblewrap"; \
	  for tool in curl git; do command -v $$tool >/dev/null 2>&1 || missing="$$missing $$tool"; done; \
	  command -v cc >/dev/null 2>&1 || missing="$$missing gcc libc6-dev"; \
	  command -v javac >/dev/null 2>&1 || missing="$$missing openjdk-17-jdk-headless"; \
	  ldconfig -p 2>/dev/null | grep -q 'libseccomp\.so\.2 ' || missing="$$missing libseccomp2"; \
	  [ ! -x /usr/bin/python3 ] || /usr/bin/python3 -c "import pip" 2>/dev/null || missing="$$missing python3-pip"; \
	  [ "$$(id -u)" != 0 ] || command -v nft >/dev/null 2>&1 || missing="$$missing nftables"; \
	  [ "$$(id -u)" != 0 ] || command -v qemu-system-x86_64 >/dev/null 2>&1 || missing="$$missing qemu-system-x86"; \
	  [ ! -x /usr/bin/python3 ] || /usr/bin/python3 -c "import ensurepip, venv" 2>/dev/null || missing="$$missing python3-venv"; \
	  [ -z "$$missing" ] || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && $(APT) $$missing; \
	  else echo "missing: sudo apt-get install$$missing" >&2; exit 1; fi; }

setup: $(STAMP) system-deps

demo: setup
	$(BIN)/python demo/run_demo.py

# Start (installing if needed) a Docker daemon; a host where none can run skips docker tests.
docker-up:
	-@bash images/dockerd-up.sh

# The Docker backend's images by the same code as `sandbox image build` (as root it installs what
# it lacks: debootstrap for the offline path): the default image, then the Node variant on top.
image: setup docker-up
	bash images/build.sh
	bash images/build.sh --variant node

# The microvm backend's kernel, initramfs and root file system (sandbox image build --microvm):
# Debian's kernel and busybox-static packages (apt-get download) and the image's debootstrap rootfs.
microvm: setup
	SANDBOX_IMAGE_CACHE=$(CURDIR)/images/.cache $(BIN)/sandbox image build --microvm

# Real projects and their dependencies for the recipe tests and the dependency benchmark
# (tests/registries.py serves them as a package index and an npm registry on loopback): pip
# download of two sdists and their test and build wheels, npm pack of minimist and its whole
# devDependency tree. Fetched once (the network is needed then), kept in FIXTURES, gitignored.
FIXTURES := .cache/fixtures
test-fixtures: setup node-deps
	$(BIN)/python tests/registries.py fetch $(FIXTURES)

# The documentation site (mkdocs, Material theme) into site/: strict, so a broken link or anchor, a page
# missing from the nav or a generated part that cannot be rendered fails (mkdocs.yml; tests/docs runs the blocks).
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# The whole suite, as users meet the product: the checkout's suite as root, then the installed
# wheel (CLI contract tests, the README's example, the pi extension's tests) beside the bubblewrap
# suite as an ordinary user (two makes at once, each one's output printed whole when it ends).
# pytest exit 5 means "no tests ran": that is a failure, not a pass.
test: setup mcp-inspector agents test-fixtures docs
	-@$(MAKE) --no-print-directory image || echo "make test: docker image not built; docker tests will be skipped with the reason" >&2
	-@$(MAKE) --no-print-directory microvm || echo "make test: microVM not built; microvm tests will be skipped with the reason" >&2
	@$(BIN)/pytest $(XDIST) $(PYTEST_ARGS); rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "make test: pytest ran no tests" >&2; exit 1; fi; exit $$rc
	@$(MAKE) --no-print-directory -j2 --output-sync=target test-installed test-user

# The Windows backend (winjob) under Wine with the official embeddable CPython: installs Wine as root,
# prepares ~/.cache/sandbox-wine (tests/run-wine.sh), runs the Windows suite and the Linux-side ps checks.
test-wine: setup
	bash tests/run-wine.sh --setup
	$(BIN)/pytest tests/integration/test_wine.py $(PYTEST_ARGS)

# The wheel, installed into a fresh venv outside the checkout (needs python3-venv and npm).
test-installed: setup system-deps node-deps
	PYTHON=$(BIN)/python bash tests/run-installed.sh $(CURDIR)

# The bubblewrap suite as an ordinary user (root creates the user; an ordinary user already is one).
test-user: setup system-deps
	@if [ "$$(id -u)" = 0 ]; then bash tests/run-as-user.sh $(CURDIR) $(XDIST); \
	  else echo "make test-user: already an ordinary user; 'make test' ran the suite as one"; fi

# pi 1.6 needs Node >= 22.19; the npm "node" devDependency provides it for the tests; npm itself must exist.
node-deps:
	@command -v npm >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && $(APT) nodejs npm; \
	  else echo "npm is missing: sudo apt-get install nodejs npm" >&2; exit 1; fi; }

# The MCP Inspector's command-line mode (npm), a second real client for tests/integration/test_mcp_inspector.py.
mcp-inspector: node-deps
	@cd tests/mcp-inspector && npm ci --no-audit --no-fund --loglevel=error

# The agents people use (Claude Code, Codex CLI, Gemini CLI, opencode) at the versions the lock pins,
# for tests/integration/test_agents.py: about 1.3 GB of native binaries, 25 s cold, 3 s when current.
# `npm install` honours the lock (and leaves it unchanged); `npm ci` refuses it here because the
# registry serves only some of opencode-ai's per-platform optional packages at its pinned version.
agents: node-deps
	@cd tests/agents && npm install --no-audit --no-fund --loglevel=error

# The pi extension, tested against pi's own tool code with the real server.
test-pi: setup node-deps
	cd integrations/pi && npm ci --no-audit --no-fund && SANDBOX_BIN="$(CURDIR)/$(BIN)/sandbox" npm test

# Sustained load (tests/soak): 20 sessions, 5,000 mixed calls (2,500 per backend) through `sandbox serve`,
# then SIGKILLs under load; leftovers, audit records, RSS and p50/p99 in ci-artifacts/soak/.
soak: setup system-deps
	-@bash images/dockerd-up.sh
	$(BIN)/pytest -m soak tests/soak -q -s $(PYTEST_ARGS)

test-unit: setup
	$(BIN)/pytest tests/unit $(PYTEST_ARGS)

# The start-up benchmark installs srt and Codex from npm into bench/.peers; srt needs socat and rg.
bench: setup node-deps test-fixtures
	@command -v socat >/dev/null && command -v rg >/dev/null && { command -v fd || command -v fdfind; } >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && $(APT) socat ripgrep fd-find; \
	  else echo "srt needs socat and ripgrep, pi's own find needs fd: sudo apt-get install socat ripgrep fd-find" >&2; fi; }
	@[ -d integrations/pi/node_modules ] || (cd integrations/pi && npm ci --no-audit --no-fund --loglevel=error)
	-@bash images/dockerd-up.sh
	$(BIN)/python bench/run.py

# Compare mount strategies on a sample workload (this repo's tracked sources, byte-compiled) under
# every backend x strategy: table.txt, report.json, report.md and chart.svg in ci-artifacts/compare/.
COMPARE_ARGS ?= --repeat 3
compare: setup
	@sample=$$(mktemp -d) && mkdir -p $$sample/project && git archive HEAD | tar -x -C $$sample/project && \
	  $(BIN)/sandbox compare $(COMPARE_ARGS) --workspace $$sample/project --report ci-artifacts/compare \
	    -- python3 -m compileall -q sandbox; rc=$$?; rm -rf $$sample; exit $$rc

# The JSON-RPC protocol's JSON Schemas, generated from the pydantic models (a test checks it is current).
schema: setup
	$(BIN)/sandbox serve --schema > integrations/protocol.schema.json

# The style gate CI runs first: lint, formatting and mypy --strict over sandbox/ and tests/.
lint: setup
	$(BIN)/ruff check sandbox tests bench demo
	$(BIN)/ruff format --check sandbox tests bench demo
	$(BIN)/mypy

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
