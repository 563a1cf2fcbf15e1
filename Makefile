# gpuforge: the two commands a newcomer types are `make demo` and `make test`.
# Everything they need (virtual environment, Go toolchain, control-plane binaries) is set up here;
# expensive things are cached outside the checkout (see docs/local-control-plane.md).

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := $(CURDIR)/.venv
BIN := $(VENV)/bin
GPUFORGE := $(BIN)/gpuforge
PYTEST_ARGS ?=
# `make test DEMO_CHECK=no` leaves out the closing demo run (CI runs `make demo` just before).
DEMO_CHECK ?= yes
export PATH := $(BIN):$(PATH)

.PHONY: help venv controlplane realnodes lint test test-unit test-integration bench demo demo-check clean demo-host

help: ## List the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | column -t -s $$'\t'

$(VENV)/.stamp: operator/pyproject.toml operator/lab/pyproject.toml
	@echo "==> Python virtual environment in .venv"
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python >= 3.11 is needed"'
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/python -m pip install --quiet --upgrade pip==25.3
	@# Both distributions: the runtime `gpuforge` (what the operator image ships) and the lab `gpuforge-lab`.
	@$(BIN)/python -m pip install --quiet -e 'operator[dev,ansible]' -e operator/lab
	@touch $@

venv: $(VENV)/.stamp ## Create the virtual environment with pinned dependencies

controlplane: venv ## Build (or reuse from cache) kube-apiserver, controller-manager, scheduler, kubectl, etcd, kwok
	@$(GPUFORGE) dev build

realnodes: controlplane ## Build (or reuse from cache) the real nodes' kubelet, programs and host image
	@$(GPUFORGE) dev build --real-nodes

lint: venv ## ruff, mypy --strict, import-linter
	cd operator && $(BIN)/ruff check src lab/src tests && $(BIN)/ruff format --check src lab/src tests
	cd operator && $(BIN)/mypy
	cd operator && $(BIN)/lint-imports

-include mk/*.mk

test-unit: venv ## Unit tests of the pure core (no cluster)
	cd operator && $(BIN)/pytest -q tests/unit $(PYTEST_ARGS)

test-integration: controlplane realnodes ## Tests against the real local control plane
	cd operator && $(BIN)/pytest -q --durations=20 tests/integration $(PYTEST_ARGS)

test: venv controlplane realnodes lint $(EXTRA_LINT) ## Set everything up and run every test (and the demo)
	cd operator && $(BIN)/pytest -q --durations=20 tests $(PYTEST_ARGS)
	$(if $(strip $(EXTRA_TESTS)),@$(MAKE) --no-print-directory $(EXTRA_TESTS))
	$(if $(filter no,$(DEMO_CHECK)),@echo "==> demo-check skipped (DEMO_CHECK=no)",@$(MAKE) --no-print-directory demo-check)

bench: controlplane demo-host ansible-collection ## Run the benchmarks, write bench/results/*.json and print a table
	$(BIN)/python bench/run.py

# The Debian host of step 1 needs podman; where it cannot be had, the demo says so and skips that step.
demo-host:
	@$(MAKE) --no-print-directory ansible-host-image || echo "==> no Debian host image here: the demo skips step 1"

demo: controlplane demo-host ansible-collection ## Set everything up and run the demo end to end
	$(GPUFORGE) demo $(DEMO_ARGS)

demo-check: controlplane demo-host ansible-collection ## The demo as a test: runs it end to end, fails if any step fails
	$(GPUFORGE) demo --name demo-check

clean: ## Stop local clusters and remove the virtual environment (the build cache stays)
	-$(GPUFORGE) dev cluster down --all
	rm -rf $(VENV)
