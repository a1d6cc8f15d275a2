#!/usr/bin/env bash
# A real single-node Kubernetes cluster on this host, without Docker or kind:
# etcd, kube-apiserver, kube-controller-manager, kube-scheduler, gpushare-scheduler (a second
# kube-scheduler with the gpushare extender configured, for a controller run as a host process),
# kube-proxy, containerd + runc + CNI bridge, and a kubelet.
#
#   hack/local-cluster.sh up              start everything (idempotent; builds binaries if needed)
#   hack/local-cluster.sh down            stop what `up` started (by PID) and remove its state
#   hack/local-cluster.sh status          show each component and the node
#   hack/local-cluster.sh env             print `export KUBECONFIG=... PATH=...` for a shell
#   hack/local-cluster.sh restart-kubelet stop the kubelet and start it again
#   hack/local-cluster.sh stop COMPONENT  kill -9 one component (fault tests); `start COMPONENT` again
#
# Settings (environment): GPUSHARE_STATE_DIR (default /var/lib/gpushare-dev), GPUSHARE_NODE_NAME
# (default gpushare-dev), GPUSHARE_EXTENDER_URL (default http://127.0.0.1:8888/scheduler),
# GPUSHARE_CACHE_DIR (binaries, see hack/build-tools.sh), GPUSHARE_HOST_SCHEDULER (default 1;
# 0: no host gpushare-scheduler, for a cluster where the chart's runs, as `make demo` installs
# it: two would both place gpushare pods, the host one failing with "connection refused" while
# no host controller listens; `up` starts or stops it to match). Needs root.
# GPUSHARE_CLUSTER_MODE picks what `up` starts (default deviceplugin):
#   deviceplugin  the distribution's containerd and Kubernetes' default feature gates, as users
#                 run the device-plugin mode;
#   dra           containerd $CONTAINERD_VERSION (hack/build-tools.sh containerd) with CDI on
#                 (specs in /etc/cdi and /var/run/cdi), and the feature gate DRAConsumableCapacity
#                 on the API server, both schedulers, the controller-manager and the kubelet, for
#                 the DRA mode (docs/dra.md). GPUSHARE_CONTAINERD_BIN names a directory with a
#                 prebuilt containerd, containerd-shim-runc-v2 and ctr instead.
# The running cluster's mode is kept in its state directory: later commands (start,
# restart-kubelet, env, status) follow it, and `up` in the other mode refuses until `down`.
# A machine without Go or a build cache (a GPU host, see docs/gpu-cluster.md) names prebuilt
# pieces instead: GPUSHARE_KUBE_BIN and GPUSHARE_ETCD_BIN (directories of the binaries),
# GPUSHARE_CNI_BIN_DIR (CNI plugins, default /usr/lib/cni) and GPUSHARE_IMAGE_ARCHIVES (a
# directory holding pause.tar, and busybox.tar if busybox is not installed); then nothing is
# built and neither Go nor busybox is needed.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
# shellcheck source=hack/lib/versions.sh
source "$here/lib/versions.sh"

STATE="${GPUSHARE_STATE_DIR:-/var/lib/gpushare-dev}"
RUN="$STATE/run"
PKI="$STATE/pki"
LOGS="$STATE/logs"
NODE="${GPUSHARE_NODE_NAME:-gpushare-dev}"
CNI_NETWORK=gpushare-dev  # the pods' CNI network (its NAT rules' comments name it)
EXTENDER_URL="${GPUSHARE_EXTENDER_URL:-http://127.0.0.1:8888/scheduler}"
KUBELET_ROOT=/var/lib/kubelet
# The node's address lives on an empty bridge interface the harness creates (the kernel here
# has no dummy driver), so components talk over an address of this host only and pods, in
# their own network namespaces, can reach it.
NODE_IP=10.200.0.1
NODE_IFACE=gpushare0
SERVICE_CIDR=10.96.0.0/16
SERVICE_IP=10.96.0.1
POD_CIDR=10.244.0.0/24
ETCD_BIN="${GPUSHARE_ETCD_BIN:-$GPUSHARE_CACHE_DIR/bin/etcd-$ETCD_VERSION}"
CNI_BIN_DIR="${GPUSHARE_CNI_BIN_DIR:-/usr/lib/cni}"
IMAGE_ARCHIVES="${GPUSHARE_IMAGE_ARCHIVES:-}"
PAUSE_IMAGE=registry.k8s.io/pause:3.10.1
BUSYBOX_IMAGE=gpushare.local/busybox:1.35
CONTAINERD_BIN="${GPUSHARE_CONTAINERD_BIN:-$GPUSHARE_CACHE_DIR/bin/containerd-$CONTAINERD_VERSION}"
CDI_SPEC_DIRS=(/etc/cdi /var/run/cdi)
DRA_FEATURE_GATES=DRAConsumableCapacity=true
COMPONENTS=(containerd etcd kube-apiserver kube-controller-manager kube-scheduler gpushare-scheduler kube-proxy kubelet)

CLUSTER_LOG_NAME=local-cluster
CLUSTER_NAME=local
APISERVER_URL=https://127.0.0.1:6443
# log, die, pid_alive, start, stop_component, wait_for, kubectl_admin, mkcert, kubeconfig
# shellcheck source=hack/lib/cluster-common.sh
source "$here/lib/cluster-common.sh"
# shellcheck source=hack/lib/go.sh
source "$here/lib/go.sh"

# MODE is the mode of the cluster in $STATE (recorded by `up`), else the one asked for;
# MODE_ARGS is the feature-gate flag each Kubernetes component gets in it (none in deviceplugin).
requested_mode() {
  local m=${GPUSHARE_CLUSTER_MODE:-deviceplugin}
  [[ $m == deviceplugin || $m == dra ]] || die "GPUSHARE_CLUSTER_MODE=$m; use deviceplugin or dra"
  echo "$m"
}
recorded_mode() { if [[ -f $STATE/mode ]]; then cat "$STATE/mode"; else requested_mode; fi; }
requested_host_scheduler() {
  local h=${GPUSHARE_HOST_SCHEDULER:-1}
  [[ $h == 0 || $h == 1 ]] || die "GPUSHARE_HOST_SCHEDULER=$h; use 1 (run the host gpushare-scheduler) or 0"
  echo "$h"
}
# Whether this cluster runs the host gpushare-scheduler (recorded by `up`, like the mode).
host_scheduler_on() { [[ $(cat "$STATE/host-scheduler" 2>/dev/null || echo 1) == 1 ]]; }
set_mode() { # MODE
  MODE=$1 MODE_ARGS=()
  if [[ $MODE == dra ]]; then MODE_ARGS=(--feature-gates "$DRA_FEATURE_GATES"); fi
  # Each mode runs its own Kubernetes release (hack/lib/versions.sh: DRA_KUBE_VERSION).
  MODE_KUBE_VERSION=$(kube_version_for "$MODE")
  KUBE_BIN="${GPUSHARE_KUBE_BIN:-$GPUSHARE_CACHE_DIR/bin/kubernetes-$MODE_KUBE_VERSION}"
}
MODE=$(recorded_mode)
set_mode "$MODE"

need() { # CMD INSTALL_HINT
  command -v "$1" >/dev/null || die "'$1' not found; install it with: $2"
}

check_prereqs() {
  [[ $(id -u) -eq 0 ]] || die "needs root (it runs containerd and a kubelet); rerun with sudo"
  if [[ $MODE == dra ]]; then
    local c
    for c in containerd containerd-shim-runc-v2 ctr; do
      [[ -x $CONTAINERD_BIN/$c ]] && continue
      [[ -z ${GPUSHARE_CONTAINERD_BIN:-} ]] || die "GPUSHARE_CONTAINERD_BIN=$CONTAINERD_BIN has no $c"
      log "containerd $CONTAINERD_VERSION missing; building it (hack/build-tools.sh containerd)"
      "$here/build-tools.sh" containerd; break
    done
  else
    need containerd "hack/install-prereqs.sh (apt-get install containerd)"
  fi
  need runc "hack/install-prereqs.sh (apt-get install runc)"
  need ctr "hack/install-prereqs.sh (apt-get install containerd)"
  need openssl "apt-get install openssl"
  need iptables "hack/install-prereqs.sh (apt-get install iptables)"
  need ip "apt-get install iproute2"
  if [[ -z $IMAGE_ARCHIVES ]]; then
    need busybox "hack/install-prereqs.sh (apt-get install busybox-static)"
    use_go  # for the pause image (hack/lib/go.sh)
  else
    [[ -f $IMAGE_ARCHIVES/pause.tar ]] || die "GPUSHARE_IMAGE_ARCHIVES=$IMAGE_ARCHIVES has no pause.tar"
    [[ -f $IMAGE_ARCHIVES/busybox.tar ]] || need busybox "hack/install-prereqs.sh (apt-get install busybox-static), or put busybox.tar in $IMAGE_ARCHIVES"
  fi
  [[ -x $CNI_BIN_DIR/bridge ]] || die "CNI plugins missing in $CNI_BIN_DIR; install with: hack/install-prereqs.sh (apt-get install containernetworking-plugins)"
  [[ -d /sys/fs/cgroup/memory || -f /sys/fs/cgroup/cgroup.controllers ]] || die "no cgroup hierarchy mounted at /sys/fs/cgroup"
  local b
  for b in kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl kube-proxy; do
    [[ -x $KUBE_BIN/$b ]] && continue
    [[ -z ${GPUSHARE_KUBE_BIN:-} ]] || die "GPUSHARE_KUBE_BIN=$KUBE_BIN has no $b"
    log "Kubernetes $MODE_KUBE_VERSION binaries missing; building them (hack/build-tools.sh)"
    if [[ $MODE == dra ]]; then "$here/build-tools.sh" kube-dra; else "$here/build-tools.sh" kube; fi
    break
  done
  if [[ ! -x $ETCD_BIN/etcd ]]; then
    [[ -z ${GPUSHARE_ETCD_BIN:-} ]] || die "GPUSHARE_ETCD_BIN=$ETCD_BIN has no etcd"
    "$here/build-tools.sh" etcd
  fi
}

# ---------------------------------------------------------------------------------------------
# PKI and kubeconfigs (mkcert and kubeconfig come from hack/lib/cluster-common.sh)

make_pki() {
  mkdir -p "$PKI"
  if [[ ! -f $PKI/ca.crt ]]; then
    openssl genrsa -out "$PKI/ca.key" 2048 2>/dev/null
    openssl req -x509 -new -key "$PKI/ca.key" -subj "/CN=gpushare-local-ca" -days 365 \
      -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
      -out "$PKI/ca.crt" 2>/dev/null
  fi
  mkcert apiserver kube-apiserver "" \
    "DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost,IP:127.0.0.1,IP:$NODE_IP,IP:$SERVICE_IP"
  mkcert apiserver-kubelet-client kube-apiserver-kubelet-client system:masters ""
  mkcert admin kubernetes-admin system:masters ""
  mkcert controller-manager system:kube-controller-manager "" ""
  mkcert scheduler system:kube-scheduler "" ""
  mkcert kube-proxy system:kube-proxy "" ""
  mkcert kubelet "system:node:$NODE" system:nodes "DNS:$NODE,DNS:localhost,IP:127.0.0.1,IP:$NODE_IP"
  [[ -f $PKI/sa.key ]] || { openssl genrsa -out "$PKI/sa.key" 2048 2>/dev/null; openssl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null; }
  kubeconfig admin admin
  kubeconfig controller-manager controller-manager
  kubeconfig scheduler scheduler
  kubeconfig kube-proxy kube-proxy
  kubeconfig kubelet kubelet
}

# ---------------------------------------------------------------------------------------------
# Host network: an empty bridge holds the node address; the CNI bridge is made by the plugin.

setup_network() {
  drop_cni_rules  # left by a cluster that ended without `down` (no pod of this one runs yet)
  if ! ip link show "$NODE_IFACE" >/dev/null 2>&1; then
    ip link add "$NODE_IFACE" type bridge
    ip addr add "$NODE_IP/32" dev "$NODE_IFACE"
    ip link set "$NODE_IFACE" up
    log "created $NODE_IFACE with $NODE_IP"
  fi
  sysctl -qw net.ipv4.ip_forward=1 || true
  modprobe br_netfilter 2>/dev/null || true
  [[ -f /proc/sys/net/bridge/bridge-nf-call-iptables ]] && sysctl -qw net.bridge.bridge-nf-call-iptables=1 || true
  mkdir -p "$STATE/cni/net.d"
  cat >"$STATE/cni/net.d/10-gpushare-bridge.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "$CNI_NETWORK",
  "plugins": [
    {"type": "bridge", "bridge": "gpushare-cni0", "isGateway": true, "ipMasq": true,
     "hairpinMode": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_CIDR"}]],
              "routes": [{"dst": "0.0.0.0/0"}], "dataDir": "$STATE/cni/ipam"}},
    {"type": "portmap", "capabilities": {"portMappings": true}},
    {"type": "loopback"}
  ]
}
EOF
}

# ---------------------------------------------------------------------------------------------
# containerd and local images

start_containerd() {
  mkdir -p "$STATE/containerd"
  if [[ $MODE == dra ]]; then start_containerd_cdi; return; fi
  cat >"$STATE/containerd/config.toml" <<EOF
version = 2
root = "$STATE/containerd/root"
state = "$RUN/containerd"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "$RUN/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  enable_cdi = false
  # Processes here may not lower oom_score_adj (no CAP_SYS_RESOURCE in this VM): clamp it.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$CNI_BIN_DIR"
    conf_dir = "$STATE/cni/net.d"
EOF
  start containerd containerd --config "$STATE/containerd/config.toml"
  wait_for "containerd" 30 ctr --address "$RUN/containerd.sock" version
}

# The DRA mode's containerd (2.x, config version 3) with CDI on: the kubelet passes on the CDI
# device names a DRA driver returns, and containerd applies the specs it finds in CDI_SPEC_DIRS.
# Its own runc shim comes first on PATH.
start_containerd_cdi() {
  local dirs
  dirs=$(printf '"%s", ' "${CDI_SPEC_DIRS[@]}")
  cat >"$STATE/containerd/config.toml" <<EOF
version = 3
root = "$STATE/containerd/root"
state = "$RUN/containerd"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.erofs"]
[grpc]
  address = "$RUN/containerd.sock"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "$PAUSE_IMAGE"
[plugins.'io.containerd.cri.v1.runtime']
  enable_cdi = true
  cdi_spec_dirs = [${dirs%, }]
  # Processes here may not lower oom_score_adj (no CAP_SYS_RESOURCE in this VM): clamp it.
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["$CNI_BIN_DIR"]
    conf_dir = "$STATE/cni/net.d"
EOF
  mkdir -p "${CDI_SPEC_DIRS[@]}"
  start containerd env PATH="$CONTAINERD_BIN:$PATH" "$CONTAINERD_BIN/containerd" \
    --config "$STATE/containerd/config.toml"
  wait_for "containerd" 30 ctr_k8s version
}

ctr_k8s() {
  local ctr=ctr
  if [[ $MODE == dra ]]; then ctr=$CONTAINERD_BIN/ctr; fi
  "$ctr" --address "$RUN/containerd.sock" -n k8s.io "$@"
}

import_images() {
  local img="$STATE/images" build="$GPUSHARE_CACHE_DIR/images"
  mkdir -p "$img" "$build"
  if ! grep -qx "$PAUSE_IMAGE" <<<"$(ctr_k8s images ls -q)"; then
    if [[ -n $IMAGE_ARCHIVES ]]; then
      cp "$IMAGE_ARCHIVES/pause.tar" "$img/pause.tar"
    elif [[ ! -x $build/pause ]]; then
      (cd "$here/images/pause" && CGO_ENABLED=0 go build "${GO_BUILD_FLAGS[@]}" -ldflags "-s -w" -o "$build/pause" .)
    fi
    [[ -f $img/pause.tar ]] || python3 "$here/lib/image_archive.py" --ref "$PAUSE_IMAGE" \
      --out "$img/pause.tar" --add "$build/pause:/pause" --entrypoint /pause
    ctr_k8s images import --no-unpack=false "$img/pause.tar" >/dev/null
    ctr_k8s images label "$PAUSE_IMAGE" io.cri-containerd.pinned=pinned >/dev/null
  fi
  if ! grep -qx "$BUSYBOX_IMAGE" <<<"$(ctr_k8s images ls -q)" && [[ -f $IMAGE_ARCHIVES/busybox.tar ]]; then
    ctr_k8s images import "$IMAGE_ARCHIVES/busybox.tar" >/dev/null
  fi
  if ! grep -qx "$BUSYBOX_IMAGE" <<<"$(ctr_k8s images ls -q)"; then
    local links=() applet
    for applet in $(busybox --list); do
      [[ $applet == busybox ]] || links+=(--symlink "/bin/$applet:busybox")
    done
    python3 "$here/lib/image_archive.py" --ref "$BUSYBOX_IMAGE" --out "$img/busybox.tar" \
      --add "$(command -v busybox):/bin/busybox" "${links[@]}" --cmd sh
    ctr_k8s images import "$img/busybox.tar" >/dev/null
  fi
}

# ---------------------------------------------------------------------------------------------
# control plane

start_etcd() {
  mkdir -p "$STATE/etcd"
  chmod 700 "$STATE/etcd"
  start etcd "$ETCD_BIN/etcd" --name local --data-dir "$STATE/etcd" \
    --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
    --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
    --initial-cluster local=http://127.0.0.1:2380 --listen-metrics-urls http://127.0.0.1:2381 \
    --quota-backend-bytes 4294967296 --snapshot-count 10000
  wait_for etcd 30 bash -c "exec 3<>/dev/tcp/127.0.0.1/2379"
}

start_apiserver() {
  start kube-apiserver "$KUBE_BIN/kube-apiserver" \
    --etcd-servers http://127.0.0.1:2379 \
    --bind-address 0.0.0.0 --advertise-address "$NODE_IP" --secure-port 6443 \
    --service-cluster-ip-range "$SERVICE_CIDR" \
    --client-ca-file "$PKI/ca.crt" --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
    --kubelet-client-certificate "$PKI/apiserver-kubelet-client.crt" --kubelet-client-key "$PKI/apiserver-kubelet-client.key" \
    --kubelet-certificate-authority "$PKI/ca.crt" --kubelet-preferred-address-types InternalIP \
    --service-account-key-file "$PKI/sa.pub" --service-account-signing-key-file "$PKI/sa.key" \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction \
    --allow-privileged=true --profiling=false --event-ttl 1h \
    --max-requests-inflight 800 --max-mutating-requests-inflight 400 "${MODE_ARGS[@]}"
  wait_for kube-apiserver 90 kubectl_admin get --raw /readyz
}

start_controller_manager() {
  start kube-controller-manager "$KUBE_BIN/kube-controller-manager" \
    --kubeconfig "$STATE/controller-manager.kubeconfig" \
    --authentication-kubeconfig "$STATE/controller-manager.kubeconfig" \
    --authorization-kubeconfig "$STATE/controller-manager.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port 10257 --leader-elect=false \
    --service-account-private-key-file "$PKI/sa.key" --root-ca-file "$PKI/ca.crt" \
    --cluster-signing-cert-file "$PKI/ca.crt" --cluster-signing-key-file "$PKI/ca.key" \
    --use-service-account-credentials=true --controllers '*,-nodeipam,-cloud-node-lifecycle' \
    --kube-api-qps 200 --kube-api-burst 400 "${MODE_ARGS[@]}"
}

write_scheduler_configs() {
  write_scheduler_configs_with 200 400
}

start_schedulers() {
  write_scheduler_configs
  start kube-scheduler "$KUBE_BIN/kube-scheduler" --config "$STATE/kube-scheduler.yaml" \
    --authentication-kubeconfig "$STATE/scheduler.kubeconfig" --authorization-kubeconfig "$STATE/scheduler.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port 10259 "${MODE_ARGS[@]}"
  host_scheduler_on || return 0
  start gpushare-scheduler "$KUBE_BIN/kube-scheduler" --config "$STATE/gpushare-scheduler.yaml" \
    --authentication-kubeconfig "$STATE/scheduler.kubeconfig" --authorization-kubeconfig "$STATE/scheduler.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port 10261 "${MODE_ARGS[@]}"
}

start_kube_proxy() {
  # kube-proxy exits whenever its config file is written (fsnotify), so a second `up` must not
  # rewrite an unchanged file: write a candidate and replace only on a difference.
  cat >"$STATE/kube-proxy.yaml.new" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: "$STATE/kube-proxy.kubeconfig"}
mode: iptables
clusterCIDR: "$POD_CIDR"
hostnameOverride: "$NODE"
bindAddress: 127.0.0.1
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
conntrack: {maxPerCore: 0}
EOF
  if cmp -s "$STATE/kube-proxy.yaml.new" "$STATE/kube-proxy.yaml"; then
    rm -f "$STATE/kube-proxy.yaml.new"
  else
    mv "$STATE/kube-proxy.yaml.new" "$STATE/kube-proxy.yaml"
  fi
  start kube-proxy "$KUBE_BIN/kube-proxy" --config "$STATE/kube-proxy.yaml"
}

# ---------------------------------------------------------------------------------------------
# kubelet

write_kubelet_config() {
  cat >"$STATE/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: "$PKI/ca.crt"}
authorization: {mode: Webhook}
address: $NODE_IP
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
tlsCertFile: "$PKI/kubelet.crt"
tlsPrivateKeyFile: "$PKI/kubelet.key"
containerRuntimeEndpoint: "unix://$RUN/containerd.sock"
cgroupDriver: cgroupfs
failSwapOn: false
# Hosts on cgroup v1 (this VM's) still run the kubelet; from v1.35 it refuses them by default.
failCgroupV1: false
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
podCIDR: "$POD_CIDR"
maxPods: 250
serializeImagePulls: false
registerNode: true
# This VM's disk is large but often mostly used by others: never evict test pods for it.
evictionHard: {memory.available: "100Mi", nodefs.available: "0%", imagefs.available: "0%", nodefs.inodesFree: "0%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
localStorageCapacityIsolation: false
fileCheckFrequency: 5s
# A device plugin's new device count reaches the Node's allocatable at the kubelet's next status
# sync: every 2 s here instead of 10 (the tests restart node agents dozens of times and wait for
# it); the status is still posted only when it changed, or every 10 s.
nodeStatusUpdateFrequency: 2s
nodeStatusReportFrequency: 10s
# A pod whose DRA claim failed to prepare (driver not registered yet, a claim the agent refused)
# is tried again only at the pod's next resync: this period plus up to half of it (60-90 s by
# default; kuberuntime returns no error for it). 10 s here, for the DRA tests' retries.
syncFrequency: 10s
EOF
}

start_kubelet() {
  write_kubelet_config
  mkdir -p "$KUBELET_ROOT"
  start kubelet "$KUBE_BIN/kubelet" --config "$STATE/kubelet.yaml" \
    --kubeconfig "$STATE/kubelet.kubeconfig" --root-dir "$KUBELET_ROOT" \
    --hostname-override "$NODE" --node-ip "$NODE_IP" --v 2 "${MODE_ARGS[@]}"
}

node_ready() {
  [[ $(kubectl_admin get node "$NODE" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null) == True ]]
}

# ---------------------------------------------------------------------------------------------

cmd_up() {
  local t0=$SECONDS c alive=0 want
  want=$(requested_mode)
  for c in "${COMPONENTS[@]}"; do pid_alive "$c" && alive=$((alive + 1)); done
  if ((alive > 0)) && [[ $MODE != "$want" ]]; then
    die "a cluster in $MODE mode is running; take it down first ($0 down), then up in $want mode"
  fi
  set_mode "$want"
  check_prereqs
  if ((alive == 0)) && [[ -d $STATE ]]; then
    # State left by a cluster whose processes are gone (reboot, ended session): start clean.
    log "found state of a stopped cluster in $STATE; removing it first"
    cmd_down
  fi
  mkdir -p "$STATE" "$RUN" "$LOGS"
  echo "$MODE" >"$STATE/mode"
  requested_host_scheduler >"$STATE/host-scheduler"
  host_scheduler_on || stop_component gpushare-scheduler
  make_pki
  setup_network
  start_containerd
  import_images
  start_etcd
  start_apiserver
  start_controller_manager
  start_schedulers
  start_kube_proxy
  start_kubelet
  wait_for "node $NODE Ready" 120 node_ready
  # The default service account must exist before pods can be created in "default".
  wait_for "default service account" 60 kubectl_admin -n default get serviceaccount default
  log "cluster up in $MODE mode in $((SECONDS - t0))s; use: eval \"\$($0 env)\""
}

kill_leftover_containers() {
  # Pods the kubelet did not get to stop: kill their tasks through containerd, then unmount.
  [[ -S $RUN/containerd.sock ]] && pid_alive containerd || return 0
  local id
  for id in $(ctr_k8s tasks ls -q 2>/dev/null); do ctr_k8s tasks kill -s KILL "$id" >/dev/null 2>&1 || true; done
  sleep 1
  for id in $(ctr_k8s tasks ls -q 2>/dev/null); do ctr_k8s tasks delete -f "$id" >/dev/null 2>&1 || true; done
  for id in $(ctr_k8s containers ls -q 2>/dev/null); do ctr_k8s containers delete "$id" >/dev/null 2>&1 || true; done
}

drop_cni_rules() {
  # NAT rules the bridge (masquerade) and portmap (hostPort) plugins added for this cluster's
  # pods. A pod whose sandbox ends without a CNI DEL (`down` stops containerd under running
  # DaemonSet and Deployment pods) leaves its rules behind, and portmap puts a new pod's rule
  # after them: a hostPort of the next cluster here would lead to the old pod's address (the
  # operator's http://<node>:9445/profile refused). Only rules whose comment names this
  # cluster's CNI network go; chains they jump to are emptied and removed.
  command -v iptables >/dev/null || return 0
  python3 - "$CNI_NETWORK" <<'PY' || log "warning: could not remove stale CNI NAT rules"
import shlex
import subprocess
import sys

mark = f'name: "{sys.argv[1]}"'
listed = subprocess.run(["iptables", "-t", "nat", "-S"], capture_output=True, text=True, check=True)
chains = set()
for line in listed.stdout.splitlines():
    args = shlex.split(line)
    if args[:1] != ["-A"] or not any(mark in a for a in args):
        continue
    subprocess.run(["iptables", "-t", "nat", "-D", *args[1:]], check=False)
    if "-j" in args and args[args.index("-j") + 1].startswith("CNI-"):
        target = args[args.index("-j") + 1]
        if not target.startswith("CNI-HOSTPORT-"):
            chains.add(target)
for chain in sorted(chains):
    subprocess.run(["iptables", "-t", "nat", "-F", chain], check=False)
    subprocess.run(["iptables", "-t", "nat", "-X", chain], check=False)
if chains:
    print(f"removed {len(chains)} stale CNI NAT chains of network {sys.argv[1]}", file=sys.stderr)
PY
}

unmount_under() { # DIR
  local m
  [[ -d $1 ]] || return 0
  for m in $(awk -v d="$1" 'index($2, d) == 1 {print $2}' /proc/mounts | sort -r); do
    umount -l "$m" 2>/dev/null || true
  done
}

cmd_down() {
  if pid_alive kube-apiserver && pid_alive kubelet; then
    # Let the kubelet tear pods down properly (CNI teardown, volume unmounts).
    kubectl_admin delete pods --all --all-namespaces --grace-period 0 --force --wait=false >/dev/null 2>&1 || true
    local i
    for i in $(seq 1 60); do
      [[ -z $(ctr_k8s containers ls -q 2>/dev/null) ]] && break
      sleep 0.5
    done
  fi
  local c
  for c in kubelet kube-proxy gpushare-scheduler kube-scheduler kube-controller-manager kube-apiserver etcd; do
    stop_component "$c"
  done
  kill_leftover_containers
  stop_component containerd
  drop_cni_rules
  [[ -x $KUBE_BIN/kube-proxy ]] && "$KUBE_BIN/kube-proxy" --cleanup >/dev/null 2>&1 || true
  ip link del gpushare-cni0 2>/dev/null || true
  ip link del "$NODE_IFACE" 2>/dev/null || true
  unmount_under "$KUBELET_ROOT"
  unmount_under "$STATE"
  rm -rf "$KUBELET_ROOT" "$STATE"
  log "cluster down; state removed"
}

cmd_status() {
  local c rc=0
  for c in "${COMPONENTS[@]}"; do
    if pid_alive "$c"; then printf '%-26s running (pid %s)\n' "$c" "$(cat "$RUN/$c.pid")"
    elif [[ $c == gpushare-scheduler ]] && ! host_scheduler_on; then
      printf '%-26s not run here (GPUSHARE_HOST_SCHEDULER=0: the chart runs it in the cluster)\n' "$c"
    else printf '%-26s stopped\n' "$c"; rc=1; fi
  done
  printf '%-26s %s\n' mode "$MODE"
  if pid_alive kube-apiserver; then kubectl_admin get nodes -o wide 2>/dev/null || rc=1; fi
  return $rc
}

cmd_env() {
  echo "export KUBECONFIG=$STATE/admin.kubeconfig"
  echo "export PATH=$KUBE_BIN:$GPUSHARE_CACHE_DIR/bin/helm-$HELM_VERSION:$GPUSHARE_CACHE_DIR/bin/kwok-$KWOK_VERSION:\$PATH"
  echo "export GPUSHARE_NODE_NAME=$NODE"
  echo "export GPUSHARE_BUSYBOX_IMAGE=$BUSYBOX_IMAGE"
  echo "export GPUSHARE_STATE_DIR=$STATE"
  echo "export GPUSHARE_CONTAINERD_SOCKET=$RUN/containerd.sock"
  echo "export GPUSHARE_CLUSTER_MODE=$MODE"
}

cmd_start_one() {
  mkdir -p "$RUN" "$LOGS"
  case $1 in
    containerd) start_containerd ;;
    etcd) start_etcd ;;
    kube-apiserver) start_apiserver ;;
    kube-controller-manager) start_controller_manager ;;
    kube-scheduler|gpushare-scheduler) start_schedulers ;;
    kube-proxy) start_kube_proxy ;;
    kubelet) start_kubelet ;;
    *) die "unknown component '$1'; one of: ${COMPONENTS[*]}" ;;
  esac
}

case ${1:-} in
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  env) cmd_env ;;
  restart-kubelet) stop_component kubelet; start_kubelet; wait_for "node $NODE Ready" 60 node_ready ;;
  stop) [[ -n ${2:-} ]] || die "usage: $0 stop COMPONENT"; stop_component "$2" KILL ;;
  start) [[ -n ${2:-} ]] || die "usage: $0 start COMPONENT"; cmd_start_one "$2" ;;
  -h|--help|help) sed -n '2,34p' "$0" | sed 's/^# \{0,1\}//' ;;
  *) sed -n '2,34p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
