#!/usr/bin/env bash
# `make demo`: bring up the local cluster with simulated GPUs, install the Helm chart from the
# image built offline from the Dockerfile, and place sample fractional pods, printing where
# each landed.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
cd "$repo"
NAMESPACE=gpushare-system
DEMO=gpushare-demo
bash hack/local-cluster.sh up
eval "$(bash hack/local-cluster.sh env)"
echo
echo "== components"
bash hack/local-cluster.sh status
echo
echo "== kubectl version"
kubectl version

# The kubelet takes one device plugin per resource: do not displace a node agent that runs as
# a host process (a developer's or a test's), and do not compete with a host controller.
release_installed() { helm status gpushare -n "$NAMESPACE" >/dev/null 2>&1; }
if ! release_installed; then
  if [[ -S /var/lib/kubelet/device-plugins/gpushare-gpu-percent.sock ]] &&
    python3 -c 'import socket,sys; s=socket.socket(socket.AF_UNIX); s.settimeout(1); s.connect(sys.argv[1])' \
      /var/lib/kubelet/device-plugins/gpushare-gpu-percent.sock 2>/dev/null; then
    echo "demo: a gpushare node agent already serves this node (a host process?); stop it first" >&2
    exit 1
  fi
fi

echo
echo "== images (the Dockerfile built offline with buildah; kube-scheduler from the harness)"
bash hack/build-image.sh all

echo
echo "== helm upgrade --install gpushare ./helm/gpushare"
helm upgrade --install gpushare ./helm/gpushare --namespace "$NAMESPACE" --create-namespace \
  --values helm/gpushare/ci/local-cluster-values.yaml --wait --timeout 5m
kubectl -n "$NAMESPACE" get pods -o wide
echo
kubectl get nodes -o custom-columns='NODE:.metadata.name,GPU-PERCENT:.status.allocatable.gpushare\.io/gpu-percent,SIMULATED:.metadata.labels.gpushare\.io/simulated'

echo
echo "== sample pods asking for GPU shares (annotation only)"
kubectl create namespace "$DEMO" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
for spec in train-a:0.5 infer-b:0.25 train-c:0.5 infer-d:0.25; do
  name=${spec%%:*} fraction=${spec#*:}
  class=batch
  [[ $name == infer-* ]] && class=latency
  kubectl -n "$DEMO" apply -f - >/dev/null <<POD
apiVersion: v1
kind: Pod
metadata:
  name: $name
  annotations:
    gpushare.io/gpu-fraction: "$fraction"
    gpushare.io/class: $class
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - name: main
      image: $GPUSHARE_BUSYBOX_IMAGE
      imagePullPolicy: Never
      command: [sleep, "3600"]
POD
  echo "  $name: gpushare.io/gpu-fraction=$fraction, class=$class"
done
kubectl -n "$DEMO" wait --for=condition=Ready pod --all --timeout=120s >/dev/null
echo
echo "== where each landed"
kubectl -n "$DEMO" get pods -o custom-columns='POD:.metadata.name,FRACTION:.metadata.annotations.gpushare\.io/gpu-fraction,NODE:.spec.nodeName,GPU:.metadata.annotations.gpushare\.io/gpu-uuid,THREADS%:.metadata.annotations.gpushare\.io/active-thread-percentage,STATE:.metadata.annotations.gpushare\.io/state,SCHEDULER:.spec.schedulerName'
echo
echo "== inside train-a"
kubectl -n "$DEMO" exec train-a -- env | grep -E '^CUDA_' | sort

echo
echo "Use it from a shell:  eval \"\$(hack/local-cluster.sh env)\"; kubectl get pods -A"
echo "Remove the demo:      kubectl delete namespace $DEMO; helm uninstall gpushare -n $NAMESPACE"
echo "Stop the cluster:     make cluster-down"
