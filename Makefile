# gpushare developer entry points. The README's two commands are `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
export PATH := $(abspath $(BIN)):$(PATH)

.PHONY: help venv lock lock-upgrade verify-lock verify-lowest krew prereqs tools demo test lint typecheck layers unit pytest cluster-up cluster-down protos verify-protos clean

help: ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | column -t -s $$'\t'

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# requirements.lock pins every runtime and dev dependency (all platforms, Python >= 3.11); the
# venv, CI and the image's build install exactly those versions (docs/development.md).
LOCK := requirements.lock
venv: $(BIN)/.installed ## create .venv with gpushare and its dev tools, at the versions in requirements.lock
$(BIN)/.installed: $(BIN)/python pyproject.toml $(LOCK)
	$(BIN)/pip install -q -c $(LOCK) -e '.[dev]'
	touch $@

lock: $(BIN)/python ## re-resolve requirements.lock after changing dependencies in pyproject.toml (keeps pins that still fit)
	hack/lock.sh write

lock-upgrade: $(BIN)/python ## re-resolve requirements.lock at the newest versions pyproject.toml allows
	hack/lock.sh upgrade

verify-lock: $(BIN)/python ## fail when requirements.lock is not what `make lock` would write
	hack/lock.sh verify

verify-lowest: $(BIN)/python ## install every dependency at its lower bound in a scratch venv and run the unit tests
	hack/lock.sh lowest

krew: $(BIN)/python ## build the krew plugin archive into dist/ and write deploy/krew/gpushare.yaml from it
	$(BIN)/python hack/krew.py

prereqs: ## install the OS packages the local cluster needs (Debian/Ubuntu, as root)
	hack/install-prereqs.sh

tools: ## build and cache Kubernetes, etcd, helm, kwok, the Prometheus Operator and containerd (DRA mode) from the Go module proxy
	hack/build-tools.sh all

demo: venv prereqs tools ## bring up the local cluster with simulated GPUs and show it
	hack/demo.sh

test: venv prereqs tools verify-lock lint typecheck layers pytest ## every quality gate and the whole test suite

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
	$(BIN)/pytest -m 'not cluster and not gpu and not gpu_cluster' tests

cluster-up: tools ## start the local cluster
	hack/local-cluster.sh up

cluster-down: ## stop the local cluster and remove its state
	hack/local-cluster.sh down
