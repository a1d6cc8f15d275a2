#!/usr/bin/env bash
# `make demo`: bring up the local cluster with simulated GPUs, install the Helm chart from the
# image built offline from the Dockerfile, place sample fractional pods and print where each
# landed, then how to go on from a shell (README, "Try it on the demo cluster").
#
# What it leaves running, so that the README's quickstart and examples/ run on it as written
# (tests/cluster/test_readme.py runs them):
# - the chart's own gpushare-scheduler only: the local cluster runs without its host one
#   (GPUSHARE_HOST_SCHEDULER=0, hack/local-cluster.sh);
# - one node with four simulated H100s; the sample pods in namespace gpushare-demo ask for one
#   GPU in all, so GPUs stay free for other namespaces (a GPU is shared within one namespace by
#   default: docs/security.md, "Tenancy boundary");
# - stand-ins for the two CUDA images the README and examples/ name: busybox images made here
#   under those names, since this cluster has no registry and no GPU. They say so in their
#   output; see STAND_IN_IMAGES below.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
cd "$repo"
t0=$SECONDS
NAMESPACE=gpushare-system
DEMO=gpushare-demo
GPUS=4
# image name -> what its `python` is (none: only busybox's sh, sleep, env, ...)
declare -A STAND_IN_IMAGES=(
  [nvcr.io/nvidia/cuda:12.6.3-base-ubuntu24.04]=""
  [nvcr.io/nvidia/pytorch:24.08-py3]="$here/images/stand-in/python"
)
GPUSHARE_HOST_SCHEDULER=0 bash hack/local-cluster.sh up
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

# A busybox image under REF, with /usr/bin/python the stand-in script PYTHON when given.
import_stand_in() { # REF [PYTHON]
  local ref=$1 python=${2:-} ctr=(ctr --address "$GPUSHARE_CONTAINERD_SOCKET" -n k8s.io) work
  grep -qx "$ref" <<<"$("${ctr[@]}" images ls -q)" && return 0
  local args=(--ref "$ref" --add "$(command -v busybox):/bin/busybox" --cmd sh) applet
  for applet in sh sleep env cat ls mkdir httpd echo; do args+=(--symlink "/bin/$applet:busybox"); done
  [[ -z $python ]] || args+=(--add "$python:/usr/bin/python")
  work=$(mktemp -d)
  python3 hack/lib/image_archive.py "${args[@]}" --out "$work/image.tar"
  "${ctr[@]}" images import "$work/image.tar" >/dev/null
  rm -rf "$work"
}
echo
echo "== stand-in images (this cluster has no registry and no GPU): busybox under the names of"
for ref in "${!STAND_IN_IMAGES[@]}"; do
  import_stand_in "$ref" "${STAND_IN_IMAGES[$ref]}"
  echo "  $ref"
done

echo
echo "== helm upgrade --install gpushare ./helm/gpushare"
helm upgrade --install gpushare ./helm/gpushare --namespace "$NAMESPACE" --create-namespace \
  --values helm/gpushare/ci/local-cluster-values.yaml --set "node.backend=simulated:${GPUS}xH100-80GB" \
  --wait --timeout 5m
kubectl -n "$NAMESPACE" get pods -o wide
# The kubelet admits pods by the device plugin's registration at once, but writes the node's
# allocatable in its next status update (up to about 10 s later): wait for it, so that the
# table below and the README's `kubectl get nodes` show the shares.
want=$((GPUS * 100))
for _ in $(seq 1 60); do
  have=$(kubectl get nodes -o jsonpath='{.items[0].status.allocatable.gpushare\.io/gpu-percent}')
  [[ $have == "$want" ]] && break
  sleep 1
done
[[ $have == "$want" ]] || { echo "demo: the node's allocatable gpushare.io/gpu-percent is '$have', not $want, after 60 s" >&2; exit 1; }
echo
kubectl get nodes -o custom-columns='NODE:.metadata.name,GPU-PERCENT:.status.allocatable.gpushare\.io/gpu-percent,SIMULATED:.metadata.labels.gpushare\.io/simulated'

echo
echo "== sample pods asking for GPU shares (annotation only), one GPU in all"
kubectl create namespace "$DEMO" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
# Ready pods are not yet a reachable webhook (kube-proxy programs its Service a moment later):
# wait until a dry-run pod comes back mutated, as the sample pods must.
for _ in $(seq 1 60); do
  scheduler=$(kubectl -n "$DEMO" create --dry-run=server -o jsonpath='{.spec.schedulerName}' -f - 2>/dev/null <<POD || true
apiVersion: v1
kind: Pod
metadata: {name: webhook-probe, annotations: {gpushare.io/gpu-fraction: "0.25"}}
spec: {containers: [{name: main, image: $GPUSHARE_BUSYBOX_IMAGE}]}
POD
  )
  [[ $scheduler == gpushare-scheduler ]] && break
  sleep 1
done
[[ $scheduler == gpushare-scheduler ]] || { echo "demo: the webhook did not answer in 60 s" >&2; exit 1; }
for spec in infer-b:0.25:latency train-a:0.5:batch train-c:0.25:batch; do
  IFS=: read -r name fraction class <<<"$spec"
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
echo "== where each landed (a batch pod that starts beside a latency pod is capped at 50% of its GPU)"
kubectl -n "$DEMO" get pods -o custom-columns='POD:.metadata.name,FRACTION:.metadata.annotations.gpushare\.io/gpu-fraction,NODE:.spec.nodeName,GPU:.metadata.annotations.gpushare\.io/gpu-uuid,THREADS%:.metadata.annotations.gpushare\.io/active-thread-percentage,STATE:.metadata.annotations.gpushare\.io/state,SCHEDULER:.spec.schedulerName'
echo
echo "== inside train-a"
kubectl -n "$DEMO" exec train-a -- env | grep -E '^CUDA_' | sort
echo
echo "== kubectl gpushare top (the plugin from this checkout's .venv)"
PATH="$repo/.venv/bin:$PATH" kubectl gpushare top

cat <<EOF

The demo cluster runs (hack/demo.sh took $((SECONDS - t0)) s). From a shell in this checkout (README, "Try it on the demo cluster"):
  eval "\$(hack/local-cluster.sh env)"   # KUBECONFIG; kubectl and helm on PATH
  export PATH="\$PWD/.venv/bin:\$PATH"    # kubectl gpushare, from this checkout
  kubectl gpushare top
Then the README's quickstart from step 2, and examples/ (kubectl apply -f examples/).
Remove the demo:  kubectl delete namespace $DEMO; helm uninstall gpushare -n $NAMESPACE
Stop the cluster: make cluster-down
EOF
