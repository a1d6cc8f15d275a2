#!/usr/bin/env bash
# The whole system on a GPU machine with no container runtime, no registry and no network:
# unpack the bundle from hack/gpu-host-bundle.sh, bring the local cluster up from it
# (hack/local-cluster.sh), import the images, install the chart with the NVML backend, and run
# the real-GPU cluster tests (pytest -m gpu_cluster tests/gpu_cluster).
#
#   hack/gpu-host-e2e.sh --bundle DIR [--mode deviceplugin|dra] [--out DIR]
#                        [--backend nvml|simulated:1xH100-80GB] [--keep] [--pytest-args "ARGS"]
#                        [-- PYTEST_ARGS...]
#
#   --bundle DIR   where the gpu-host-bundle.tar.xz.part-* files and SHA256SUMS are
#   --mode M       the chart's mode (default deviceplugin): dra installs `mode: dra` on the
#                  local cluster's DRA mode and runs tests/gpu_cluster/dra; the bundle must be
#                  made with hack/gpu-host-bundle.sh --mode dra
#   --out DIR      results: junit.xml, gpu-cluster.json, pytest.log, cluster logs (default:
#                  ./gpu-cluster-out)
#   --backend B    the node agent's backend (default nvml). A simulated backend rehearses the
#                  whole path on a machine without a GPU: every step runs, the GPU checks skip.
#   --keep         leave the cluster and the release running (default: take both down)
#   --pytest-args  more arguments for pytest, split at spaces (no quoting)
#   -- ARGS...     more arguments for pytest, each as given: -- -k 'pause or gemm_rates'
#
# What the pods run: the tests' CUDA pods use a tiny image (directories and the usr-merge
# symlinks, nothing else) and mount the host's /usr and the host Python environment that
# holds PyTorch read-only, so no registry and no CUDA image are needed (docs/gpu-cluster.md).
# Needs root, nvidia-smi and a python3 with torch and pytest on the GPU machine.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
# shellcheck source=hack/lib/versions.sh
source "$here/lib/versions.sh"

log() { printf '%s gpu-host-e2e: %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }
# shellcheck source=hack/lib/bundle.sh
source "$here/lib/bundle.sh"

bundle="" out="$PWD/gpu-cluster-out" backend=nvml keep=0 pytest_args="" mode=deviceplugin
extra=()
while (($#)); do
  case $1 in
    --bundle) bundle=$2; shift ;;
    --mode) mode=$2; shift ;;
    --out) out=$2; shift ;;
    --backend) backend=$2; shift ;;
    --keep) keep=1 ;;
    --pytest-args) pytest_args=$2; shift ;;
    --) shift; extra=("$@"); break ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
  shift
done
[[ -n $bundle ]] || die "--bundle DIR is required (the parts written by hack/gpu-host-bundle.sh)"
[[ $(id -u) -eq 0 ]] || die "needs root (containerd, the kubelet and MPS run here)"
[[ $backend == nvml || $backend == simulated:* ]] || die "--backend must be nvml or simulated:<count>x<model>, got '$backend'"
[[ $mode == deviceplugin || $mode == dra ]] || die "--mode must be deviceplugin or dra, got '$mode'"
mkdir -p "$out"
out=$(cd "$out" && pwd)
exec > >(tee -a "$out/e2e.log") 2>&1

PYTHON=${GPUSHARE_HOST_PYTHON:-$(command -v python3 || die "python3 not found")}
if [[ $backend == nvml ]]; then
  command -v nvidia-smi >/dev/null || die "nvidia-smi not found: is the NVIDIA driver installed?"
  nvidia-smi --query-gpu=name,uuid,driver_version,compute_mode,memory.total --format=csv >"$out/nvidia-smi.csv" ||
    die "nvidia-smi failed; the node agent's NVML backend needs a working driver"
  "$PYTHON" -c 'import torch; assert torch.cuda.is_available()' ||
    die "$PYTHON has no PyTorch that sees a GPU; set GPUSHARE_HOST_PYTHON to one that does"
fi

# ---- unpack -----------------------------------------------------------------------------
work=${GPUSHARE_GPU_HOST_WORK:-/var/tmp/gpushare-gpu-host}
B=$(bundle_unpack "$bundle" "$work")
bundle_env "$B" "$mode"

state=${GPUSHARE_STATE_DIR:-/var/lib/gpushare-dev}
cleanup() {
  local rc=$?
  cp -r "$state/logs" "$out/cluster-logs" 2>/dev/null || true
  if ((keep == 0)); then
    log "taking the release and the cluster down"
    helm uninstall gpushare -n gpushare --wait --timeout 3m >/dev/null 2>&1 || true
    bash "$here/local-cluster.sh" down >/dev/null 2>&1 || true
  fi
  exit $rc
}
trap cleanup EXIT

# ---- cluster ----------------------------------------------------------------------------
log "bringing the cluster up"
bash "$here/local-cluster.sh" up
eval "$(bash "$here/local-cluster.sh" env)"
socket=$GPUSHARE_CONTAINERD_SOCKET
ctr_k8s() { ctr --address "$socket" -n k8s.io "$@"; }

log "importing images: gpushare, kube-scheduler (from the carried binary), the host-rootfs pod image"
ctr_k8s images import "$B/images/gpushare.tar" >/dev/null
"$PYTHON" "$here/lib/image_archive.py" --ref "registry.k8s.io/kube-scheduler:$(kube_version_for "$mode")" \
  --out "$work/kube-scheduler.tar" --add "$B/bin/kube-scheduler:/usr/local/bin/kube-scheduler" \
  --entrypoint /usr/local/bin/kube-scheduler >/dev/null
ctr_k8s images import "$work/kube-scheduler.tar" >/dev/null
# The CUDA pods' image: only the usr-merge links; /usr and the Python environment come from the
# host by hostPath (read-only), so the pod runs the host's own Python, PyTorch and CUDA driver.
empty=$work/empty; : >"$empty"
"$PYTHON" "$here/lib/image_archive.py" --ref gpushare.local/host-rootfs:1 --out "$work/host-rootfs.tar" \
  --add "$empty:/usr/.keep" --add "$empty:/opt/.keep" \
  --symlink /bin:usr/bin --symlink /sbin:usr/sbin --symlink /lib:usr/lib --symlink /lib64:usr/lib64 \
  --cmd /bin/sh >/dev/null
ctr_k8s images import "$work/host-rootfs.tar" >/dev/null

# ---- chart ------------------------------------------------------------------------------
values=("--values" "$repo/helm/gpushare/ci/local-cluster-values.yaml" "--set" "node.backend=$backend" "--set" "mode=$mode")
# Tests never change a lent GPU's compute mode (the chart sets EXCLUSIVE_PROCESS by default).
values+=(--set "node.setExclusiveProcess=false")
if [[ $backend == nvml ]]; then
  # No NVIDIA container runtime here: mount the driver's directory (NVML, libcuda and the MPS
  # binaries) into the node agent at its host path and put it on PATH and LD_LIBRARY_PATH.
  mps=$(command -v nvidia-cuda-mps-control) || die "nvidia-cuda-mps-control not found on PATH"
  nvml=$(ldconfig -p | awk '/libnvidia-ml.so.1 / {print $NF; exit}')
  [[ -n $nvml ]] || die "libnvidia-ml.so.1 not in the linker cache (ldconfig -p)"
  driver_bin=$(dirname "$(readlink -f "$mps")") driver_lib=$(dirname "$(readlink -f "$nvml")")
  driver_root=$(dirname "$driver_bin")
  [[ $driver_root != /usr && $driver_root != / ]] ||
    die "the driver lives in $driver_root; mount its files one by one (docs/gpu-cluster.md)"
  log "driver: $driver_root (bin $driver_bin, lib $driver_lib)"
  values+=(
    --set "node.extraVolumes[0].name=nvidia-driver" --set "node.extraVolumes[0].hostPath.path=$driver_root"
    --set "node.extraVolumeMounts[0].name=nvidia-driver" --set "node.extraVolumeMounts[0].mountPath=$driver_root"
    --set "node.extraVolumeMounts[0].readOnly=true"
    --set "node.extraEnv[0].name=PATH" --set "node.extraEnv[0].value=$driver_bin:/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin"
    --set "node.extraEnv[1].name=LD_LIBRARY_PATH" --set "node.extraEnv[1].value=$driver_lib"
  )
fi
log "installing the chart (mode $mode, backend $backend)"
helm upgrade --install gpushare "$repo/helm/gpushare" --namespace gpushare --create-namespace "${values[@]}" \
  --wait --timeout 5m >"$out/helm-install.txt"
for i in $(seq 1 120); do
  kubectl -n gpushare get pods -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' |
    grep -qv True || break
  sleep 1
done
kubectl -n gpushare get pods -o wide | tee "$out/release-pods.txt"

# ---- tests ------------------------------------------------------------------------------
pod_lib=${LD_LIBRARY_PATH:-}
[[ $backend == nvml ]] && pod_lib=$driver_lib${pod_lib:+:$pod_lib}
# /usr plus every directory the Python environment lives in outside it (a virtualenv, the
# interpreter it was made from), each mounted read-only at its own path.
host_dirs=$("$PYTHON" - <<'PY'
import os, sys
dirs = {"/usr"}
for d in (sys.prefix, sys.base_prefix, os.path.dirname(os.path.dirname(os.path.realpath(sys.executable)))):
    if d != "/usr" and not d.startswith("/usr/"):
        dirs.add(d)
print(":".join(sorted(dirs)))
PY
)
export GPUSHARE_GPU_CLUSTER=1 GPUSHARE_GPU_CLUSTER_BACKEND=$backend GPUSHARE_GPU_CLUSTER_MODE=$mode
export GPUSHARE_RELEASE_NAMESPACE=gpushare GPUSHARE_POD_IMAGE=gpushare.local/host-rootfs:1
export GPUSHARE_POD_PYTHON=$("$PYTHON" -c 'import sys; print(sys.executable)')
export GPUSHARE_POD_HOST_DIRS=$host_dirs GPUSHARE_POD_LD_LIBRARY_PATH=$pod_lib
export GPUSHARE_GPU_CLUSTER_OUT=$out
# Each mode's checks: the device plugin's in tests/gpu_cluster, the DRA driver's in its dra/.
tests=(tests/gpu_cluster --ignore=tests/gpu_cluster/dra)
# The operator profiles the same way in both modes; its test runs in each.
[[ $mode == dra ]] && tests=(tests/gpu_cluster/dra tests/gpu_cluster/test_operator_profiling.py)
log "running pytest -m gpu_cluster ${tests[*]} (pods run $GPUSHARE_POD_PYTHON from $host_dirs)"
set +e
# shellcheck disable=SC2086
(cd "$repo" && "$PYTHON" -m pytest -m gpu_cluster "${tests[@]}" -p no:cacheprovider -v -rA \
  --junitxml "$out/junit.xml" $pytest_args "${extra[@]}") 2>&1 | tee "$out/pytest.log"
rc=${PIPESTATUS[0]}
set -e
log "pytest exit code $rc; results in $out"
exit "$rc"
