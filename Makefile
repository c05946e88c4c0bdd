# Fibermill: `make run` starts everything locally, `make test` runs the test suite.
PY ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=

.PHONY: install system-deps models run test typecheck lint bench bench-gpu chaos clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch is pinned (CPU wheel here) in the same resolve as diffusers/transformers/accelerate
	$(BIN)/python -m pip install -q -e ".[api,worker,models,cli,dev]"
	touch $(STAMP)

install: $(STAMP)

models: install
	$(BIN)/python -m modelbuild --models-dir models

run: models
	$(BIN)/python -m services.devstack.run

# The browser tests drive Debian's chromium (no browser download works offline); the metrics
# tests run promtool.
system-deps:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing chromium (Debian package) for the browser tests"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else echo "chromium is missing: install Debian's chromium package (sudo apt-get install chromium)"; exit 1; fi; }
# promtool (Debian's prometheus package) lints the API's and workers' /metrics pages.
	@command -v promtool >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing prometheus (Debian package, for promtool) for the metrics tests"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null; \
	  else echo "promtool is missing: install Debian's prometheus package (sudo apt-get install prometheus)"; exit 1; fi; }

# Types first: a wrong name or argument fails here in a minute, not in a test run of fifteen.
TYPED := services shared benchmarks modelbuild

typecheck: install
	$(BIN)/mypy $(TYPED)

test: install system-deps lint typecheck
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check .

clean:
	rm -rf run models/tiny-* .pytest_cache

# The peers section runs LitServe beside Fibermill: the `bench` extra installs it (no torch).
bench: models
	$(BIN)/python -m pip install -q -e ".[bench]"
	$(BIN)/python -m benchmarks

# Fault injection: 1000 jobs over 6 minutes while a worker is killed every 8 s, and API
# replicas and Redis are killed, restarted and frozen (docs/reliability.md).
chaos: models
	$(BIN)/python -m benchmarks.chaos.run --jobs 1000 --period 360 --steps 8 \
	  --registry models/registry.yaml --out docs/chaos.md
	$(BIN)/python -m benchmarks.chaos.run --jobs 1000 --period 360 --steps 8 \
	  --registry models/registry.yaml --profile failover --out docs/chaos-failover.md

# On a machine with a CUDA GPU: the image graph against diffusers' own pipeline, sync counts,
# and the text decoder against transformers' continuous batching and static generate.
bench-gpu: $(STAMP)
	$(BIN)/python -m benchmarks.gpu --out docs/benchmarks-gpu.md
	$(BIN)/python -m benchmarks.decoders --out docs/benchmarks-gpu.md
