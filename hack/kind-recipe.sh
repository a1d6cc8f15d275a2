#!/usr/bin/env bash
# gpushare on kind, for users with Docker.
#
#   *** NOT EXERCISED BY CI: the CI machine has no Docker engine. The project's tests use the
#   *** local harness (hack/local-cluster.sh, tests/cluster/test_chart_e2e.py) instead.
#
# Creates a kind cluster (one control plane, one worker), builds the image from the Dockerfile,
# loads it into the nodes, installs the chart with simulated GPUs (kind nodes have none) and
# places three pods with fractional GPU shares, printing where each landed.
#
#   hack/kind-recipe.sh          # create, build, install, place
#   hack/kind-recipe.sh delete   # delete the kind cluster
#
# Needs docker, kind, kubectl and helm on PATH, and network access to pull the base image and
# registry.k8s.io/kube-scheduler.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
CLUSTER="${KIND_CLUSTER_NAME:-gpushare}"
NAMESPACE=gpushare-system
version=$(sed -n 's/^appVersion: "\(.*\)"/\1/p' "$repo/helm/gpushare/Chart.yaml")
IMAGE="gpushare/gpushare:$version"

for tool in docker kind kubectl helm; do
  command -v "$tool" >/dev/null || { echo "kind-recipe: '$tool' not found" >&2; exit 1; }
done

if [[ ${1:-} == delete ]]; then
  kind delete cluster --name "$CLUSTER"
  exit 0
fi

if ! grep -qx "$CLUSTER" <<<"$(kind get clusters)"; then
  kind create cluster --name "$CLUSTER" --config - <<'KIND'
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
nodes:
  - role: control-plane
  - role: worker
KIND
fi
kubectl config use-context "kind-$CLUSTER" >/dev/null

docker build --build-arg "VERSION=$version" \
  --build-arg "REVISION=$(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)" \
  -t "$IMAGE" "$repo"
kind load docker-image "$IMAGE" --name "$CLUSTER"

# ci/local-cluster-values.yaml: simulated GPUs on every Linux node the DaemonSet tolerates (the
# workers); kind has cluster DNS, so the pinned Service IP is not needed.
helm upgrade --install gpushare "$repo/helm/gpushare" --namespace "$NAMESPACE" --create-namespace \
  --values "$repo/helm/gpushare/ci/local-cluster-values.yaml" \
  --set controller.service.clusterIP= --wait --timeout 5m
kubectl -n "$NAMESPACE" get pods -o wide

kubectl create namespace gpushare-demo --dry-run=client -o yaml | kubectl apply -f -
for spec in share-a:0.5 share-b:0.25 share-c:0.5; do
  name=${spec%%:*} fraction=${spec#*:}
  kubectl -n gpushare-demo apply -f - <<POD
apiVersion: v1
kind: Pod
metadata:
  name: $name
  annotations: {gpushare.io/gpu-fraction: "$fraction"}
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - name: main
      image: $IMAGE
      command: [sleep, infinity]
POD
done
kubectl -n gpushare-demo wait --for=condition=Ready pod --all --timeout=120s
kubectl -n gpushare-demo get pods -o custom-columns='POD:.metadata.name,FRACTION:.metadata.annotations.gpushare\.io/gpu-fraction,NODE:.spec.nodeName,GPU:.metadata.annotations.gpushare\.io/gpu-uuid,THREADS%:.metadata.annotations.gpushare\.io/active-thread-percentage'
echo
echo "Clean up: kubectl delete namespace gpushare-demo; helm uninstall gpushare -n $NAMESPACE; $0 delete"
