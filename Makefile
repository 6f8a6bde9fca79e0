# Two commands set up everything on a fresh Debian machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
APT    := DEBIAN_FRONTEND=noninteractive apt-get install -y -qq
PYTEST_ARGS ?=

.PHONY: setup system-deps node-deps demo test test-unit test-pi bench lint image docker-up compare schema clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c "import ensurepip, venv" 2>/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && $(APT) python3-venv; \
	  else echo "python3-venv is missing: sudo apt-get install python3-venv" >&2; exit 1; fi; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

# bubblewrap is the embedded default backend; install it when missing (we may be root).
system-deps:
	@command -v bwrap >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && $(APT) bubblewrap; \
	  else echo "bubblewrap is missing: sudo apt-get install bubblewrap" >&2; exit 1; fi; }

setup: $(STAMP) system-deps

demo: setup
	$(BIN)/python demo/run_demo.py

# Start (installing if needed) a Docker daemon; a host where none can run skips docker tests.
docker-up:
	-@bash images/dockerd-up.sh

image: setup docker-up
	bash images/build.sh

# pytest exit 5 means "no tests ran": that is a failure, not a pass.
test: setup
	-@$(MAKE) --no-print-directory image || echo "make test: docker image not built; docker tests will be skipped with the reason" >&2
	@$(BIN)/pytest $(PYTEST_ARGS); rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "make test: pytest ran no tests" >&2; exit 1; fi; exit $$rc
	@$(MAKE) --no-print-directory test-pi

# pi 1.6 needs Node >= 22.19; the npm "node" devDependency provides it for the tests; npm itself must exist.
node-deps:
	@command -v npm >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && $(APT) nodejs npm; \
	  else echo "npm is missing: sudo apt-get install nodejs npm" >&2; exit 1; fi; }

# The pi extension, tested against pi's own tool code with the real server.
test-pi: setup node-deps
	cd integrations/pi && npm ci --no-audit --no-fund && SANDBOX_BIN="$(CURDIR)/$(BIN)/sandbox" npm test

test-unit: setup
	$(BIN)/pytest tests/unit $(PYTEST_ARGS)

bench: setup
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

lint: setup
	$(BIN)/ruff check sandbox tests bench demo
	$(BIN)/mypy

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
