# gpushare developer entry points. The README's two commands are `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
export PATH := $(abspath $(BIN)):$(PATH)

.PHONY: help venv lock lock-upgrade verify-lock verify-lowest krew cli-wheel release prereqs tools demo test lint typecheck layers unit pytest cluster-up cluster-down protos verify-protos clean

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

cli-wheel: $(BIN)/python ## build the CLI-only distribution kubectl-gpushare (no dependency) into dist/
	$(BIN)/python hack/cli_wheel.py

release: venv ## build every release artefact (OCI image archive, chart, wheels, krew archive, CRD, SHA256SUMS) into dist/release-v<version>/
	hack/release.sh

prereqs: ## install the OS packages the local cluster and the tests need (Debian/Ubuntu, as root)
	hack/install-prereqs.sh all

tools: ## build and cache everything the tests run (Kubernetes for both modes, etcd, helm, kwok, the Prometheus Operator, Prometheus, containerd 2, Kueue) from the Go module proxy
	hack/build-tools.sh all

# The demo installs and builds only what it runs: no Prometheus package, no DRA-mode Kubernetes,
# kwok, Prometheus Operator or containerd 2 (README, "Two commands", for the measured time).
demo: ## bring up the local cluster with simulated GPUs, install the chart, place sample pods
	hack/install-prereqs.sh demo
	$(MAKE) venv
	hack/build-tools.sh demo
	hack/demo.sh

test: prereqs venv tools verify-lock verify-protos lint typecheck layers pytest ## every quality gate and the whole test suite

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

cluster-up: ## start the local cluster (builds the binaries its mode runs when missing)
	hack/local-cluster.sh up

cluster-down: ## stop the local cluster and remove its state
	hack/local-cluster.sh down

protos: venv ## regenerate the kubelet gRPC stubs (and .pyi) from the .proto files in gpushare/node
	hack/gen-protos.sh

verify-protos: venv ## fail when the committed gRPC stubs differ from what `make protos` writes
	hack/verify-protos.sh

clean: ## remove what builds and tests leave in the checkout (dist/, build/, tool caches, __pycache__); .venv and the tool cache outside the repo stay
	rm -rf dist build .pytest_cache .mypy_cache .ruff_cache .import_linter_cache .hypothesis
	find . -path ./.venv -prune -o \( -name __pycache__ -o -name '*.egg-info' \) -type d -prune -exec rm -rf {} +
