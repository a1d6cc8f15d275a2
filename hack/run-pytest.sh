#!/usr/bin/env bash
# Run the test suite. Cluster tests bring the local cluster up once per session (see
# tests/fixtures/cluster.py). A cluster this run started is taken down afterwards unless
# GPUSHARE_KEEP_CLUSTER=1; one that was already running is left as it was.
#
# The DRA tests (tests/cluster/dra) need the cluster in dra mode (hack/local-cluster.sh,
# GPUSHARE_CLUSTER_MODE): in the first session, on the device-plugin cluster users run, they
# skip. A full run (no arguments) then takes down the cluster it started and runs them in a
# second session on a DRA-mode cluster. With arguments, only the first session runs; run
# `GPUSHARE_CLUSTER_MODE=dra hack/run-pytest.sh tests/cluster/dra` for the DRA tests alone.
# GPUSHARE_KEEP_CLUSTER=1 keeps the last cluster of the run (the DRA one after a full run).
#
# In a full run the tests that need no local cluster (no cluster, gpu or gpu_cluster marker,
# and the own_control_plane ones: the scale smoke's control plane has its own ports and state)
# run in a session of their own beside the DRA session, which mostly waits on its cluster; that
# takes their 3-4 minutes off the run (docs/development.md, "How long make test takes").
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
# Each session ends with its slowest tests, so a log says where the suite's time goes.
durations=(--durations=25 --durations-min=5)
for arg in "$@"; do [[ $arg == --durations* ]] && durations=(); done
unit_marks='not (cluster or gpu or gpu_cluster) or own_control_plane'
full=0
(($# == 0)) && [[ ${GPUSHARE_CLUSTER_MODE:-deviceplugin} != dra ]] && [[ $(id -u) -eq 0 ]] &&
  ! ((was_up)) && full=1
if ((full)); then
  echo "run-pytest: first session: the cluster tests, on a cluster in device-plugin mode" >&2
  .venv/bin/pytest "${order[@]}" "${durations[@]}" -m "not ($unit_marks)"
else
  .venv/bin/pytest "${order[@]}" "${durations[@]}" "$@"
fi
rc=$?
is_root=0
[[ $(id -u) -eq 0 ]] && is_root=1
take_down() {
  if ((was_up == 0)) && [[ ${GPUSHARE_KEEP_CLUSTER:-0} != 1 ]] && ((is_root)); then
    bash hack/local-cluster.sh down >/dev/null 2>&1 || true
  fi
}
if ((rc == 5)); then
  echo "run-pytest: pytest collected no tests; that is a failure here" >&2
  take_down
  exit 1
fi
if (($# == 0)) && [[ ${GPUSHARE_CLUSTER_MODE:-deviceplugin} != dra ]] && ((is_root)); then
  if ((was_up)); then
    echo "run-pytest: a cluster was already running, so the DRA tests were skipped; run them with" \
      "hack/local-cluster.sh down && GPUSHARE_CLUSTER_MODE=dra hack/run-pytest.sh tests/cluster/dra" >&2
  else
    echo "run-pytest: second session: tests/cluster/dra on a cluster in dra mode," \
      "beside a third: the tests that need no local cluster (their output follows the DRA session's)" >&2
    bash hack/local-cluster.sh down >/dev/null 2>&1 || true
    unit_log=$(mktemp)
    unit_tmp=$(mktemp -d) # its own temporary tree: two sessions never prune each other's
    .venv/bin/pytest "${durations[@]}" --basetemp="$unit_tmp" -m "$unit_marks" >"$unit_log" 2>&1 &
    unit_pid=$!
    GPUSHARE_CLUSTER_MODE=dra .venv/bin/pytest "${durations[@]}" tests/cluster/dra
    dra_rc=$?
    wait "$unit_pid"
    unit_rc=$?
    echo "run-pytest: third session: the tests that need no local cluster" >&2
    cat "$unit_log"
    rm -rf "$unit_log" "$unit_tmp"
    ((rc == 0)) && rc=$dra_rc
    ((rc == 0)) && rc=$unit_rc
  fi
fi
take_down
exit $rc
