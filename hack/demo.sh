#!/usr/bin/env bash
# `make demo`: bring up the local cluster with simulated GPUs and show it.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
cd "$repo"
bash hack/local-cluster.sh up
eval "$(bash hack/local-cluster.sh env)"
echo
echo "== components"
bash hack/local-cluster.sh status
echo
echo "== kubectl version"
kubectl version
echo
echo "Use it from a shell:  eval \"\$(hack/local-cluster.sh env)\"; kubectl get pods -A"
echo "Stop it:              make cluster-down"
