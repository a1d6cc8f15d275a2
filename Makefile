# gpushare developer entry points. The README's two commands are `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
export PATH := $(abspath $(BIN)):$(PATH)

.PHONY: help venv prereqs tools demo test lint typecheck layers unit pytest cluster-up cluster-down protos verify-protos clean

help: ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | column -t -s $$'\t'

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

venv: $(BIN)/.installed ## create .venv with gpushare and its dev tools
$(BIN)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

prereqs: ## install the OS packages the local cluster needs (Debian/Ubuntu, as root)
	hack/install-prereqs.sh

tools: ## build and cache Kubernetes, etcd, helm and kwok from the Go module proxy
	hack/build-tools.sh all

demo: venv prereqs tools ## bring up the local cluster with simulated GPUs and show it
	hack/demo.sh

test: venv prereqs tools lint typecheck layers pytest ## every quality gate and the whole test suite

lint: venv ## ruff lint and format check
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: venv ## mypy --strict on the package
	$(BIN)/mypy --strict gpushare

layers: venv ## import-linter layering contracts
	$(BIN)/lint-imports

pytest: venv ## the test suite (brings the local cluster up once per session)
	hack/run-pytest.sh

unit: venv ## only the tests that need no cluster
	$(BIN)/pytest -m 'not cluster and not gpu' tests

cluster-up: tools ## start the local cluster
	hack/local-cluster.sh up

cluster-down: ## stop the local cluster and remove its state
	hack/local-cluster.sh down
