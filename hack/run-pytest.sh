#!/usr/bin/env bash
# Run the test suite. Cluster tests bring the local cluster up once per session (see
# tests/fixtures/cluster.py). A cluster this run started is taken down afterwards unless
# GPUSHARE_KEEP_CLUSTER=1; one that was already running is left as it was.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
cd "$repo"
was_up=0
bash hack/local-cluster.sh status >/dev/null 2>&1 && was_up=1
# Modules marked order_independent run in a new random order each time (the seed is in
# pytest's header; replay one with --test-order=shuffle:SEED). A caller's --test-order wins.
order=(--test-order=shuffle)
for arg in "$@"; do [[ $arg == --test-order* ]] && order=(); done
.venv/bin/pytest "${order[@]}" "$@"
rc=$?
if ((was_up == 0)) && [[ ${GPUSHARE_KEEP_CLUSTER:-0} != 1 ]] && [[ $(id -u) -eq 0 ]]; then
  bash hack/local-cluster.sh down >/dev/null 2>&1 || true
fi
if ((rc == 5)); then
  echo "run-pytest: pytest collected no tests; that is a failure here" >&2
  exit 1
fi
exit $rc
