#!/usr/bin/env bash
# A separate, node-less control plane for scale benchmarks, with KWOK faking the nodes:
# etcd, kube-apiserver, kube-scheduler (default-scheduler), gpushare-scheduler (kube-scheduler
# with the gpushare extender) and the kwok controller. It shares only binaries with
# hack/local-cluster.sh: own state dir, own PKI, own ports, so it never disturbs tests running
# on the local cluster (6443, 2379/2380, 10257, 10259, 10261, 8888, 9443).
#
#   hack/kwok-cluster.sh up       start everything (fresh state; builds binaries if needed)
#   hack/kwok-cluster.sh down     stop what `up` started (by PID) and remove its state
#   hack/kwok-cluster.sh status   show each component
#   hack/kwok-cluster.sh env      print `export KUBECONFIG=...` for a shell
#   hack/kwok-cluster.sh pki DIR  write a CA, certificates and keys into DIR (for
#                                 GPUSHARE_SCALE_PKI_DIR on a machine without openssl)
#
# No kube-controller-manager runs: nothing here needs one (no Deployments, no service-account
# tokens; the API server's TaintNodesByCondition admission is off, so no not-ready taint waits
# for the node lifecycle controller) and it would only take CPU from what is measured.
#
# Ports (all on 127.0.0.1): etcd 12379/12380 (metrics 12381), kube-apiserver 16443,
# kube-scheduler 10359, gpushare-scheduler 10361; the extender is expected at
# GPUSHARE_SCALE_EXTENDER_URL (default http://127.0.0.1:18888/scheduler).
# Settings (environment): GPUSHARE_SCALE_STATE_DIR (default /var/lib/gpushare-scale),
# GPUSHARE_SCALE_SCHEDULER_QPS (client QPS and burst of both schedulers, default 5000),
# GPUSHARE_SCALE_ETCD_NO_FSYNC=1 (etcd --unsafe-no-fsync, to keep a busy shared disk out of it),
# GPUSHARE_SCALE_KWOK_POD_WORKERS (kwok's parallel pod stage workers, default 256),
# GPUSHARE_SCALE_GPUSHARE_NODES_PERCENT (percentageOfNodesToScore of the gpushare-scheduler
# profile, 1-100; default unset: kube-scheduler's adaptive share, 42 % at 1000 nodes),
# GPUSHARE_SCALE_FEATURE_GATES (--feature-gates of kube-apiserver and both schedulers, e.g.
# DRAConsumableCapacity=true for the DRA phase; default none), GPUSHARE_SCALE_DRA=1 (run the DRA
# mode's Kubernetes, DRA_KUBE_VERSION in hack/lib/versions.sh, instead of KUBE_VERSION),
# GPUSHARE_CACHE_DIR (binaries, see hack/build-tools.sh), GPUSHARE_SCALE_BIN_DIR (one directory
# with kube-apiserver, kube-scheduler, etcd and kwok to use instead: nothing is built, and
# neither kubectl nor curl is needed), GPUSHARE_SCALE_PKI_DIR (copy the PKI written by `pki DIR`
# instead of making one: no openssl needed). Needs root only for the default state dir.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=hack/lib/versions.sh
source "$here/lib/versions.sh"

STATE="${GPUSHARE_SCALE_STATE_DIR:-/var/lib/gpushare-scale}"
RUN="$STATE/run"
PKI="$STATE/pki"
LOGS="$STATE/logs"
EXTENDER_URL="${GPUSHARE_SCALE_EXTENDER_URL:-http://127.0.0.1:18888/scheduler}"
SCHED_QPS="${GPUSHARE_SCALE_SCHEDULER_QPS:-5000}"
KWOK_POD_WORKERS="${GPUSHARE_SCALE_KWOK_POD_WORKERS:-256}"
GPUSHARE_NODES_PERCENT="${GPUSHARE_SCALE_GPUSHARE_NODES_PERCENT:-}"
FEATURE_GATES=()
[[ -n ${GPUSHARE_SCALE_FEATURE_GATES:-} ]] && FEATURE_GATES=(--feature-gates "$GPUSHARE_SCALE_FEATURE_GATES")
APISERVER_PORT=16443
ETCD_CLIENT_PORT=12379
ETCD_PEER_PORT=12380
ETCD_METRICS_PORT=12381
KUBE_SCHEDULER_PORT=10359
GPUSHARE_SCHEDULER_PORT=10361
if [[ ${GPUSHARE_SCALE_DRA:-0} == 1 ]]; then KUBE_VERSION=$DRA_KUBE_VERSION; fi
KUBE_BIN="$GPUSHARE_CACHE_DIR/bin/kubernetes-$KUBE_VERSION"
ETCD_BIN="$GPUSHARE_CACHE_DIR/bin/etcd-$ETCD_VERSION"
KWOK_BIN="$GPUSHARE_CACHE_DIR/bin/kwok-$KWOK_VERSION"
BIN_DIR="${GPUSHARE_SCALE_BIN_DIR:-}"
PKI_FROM="${GPUSHARE_SCALE_PKI_DIR:-}"
if [[ -n $BIN_DIR ]]; then KUBE_BIN=$BIN_DIR ETCD_BIN=$BIN_DIR KWOK_BIN=$BIN_DIR; fi
# Nodes kwok fakes carry this annotation; kwok leaves every other node alone.
KWOK_NODE_SELECTOR="kwok.x-k8s.io/node=fake"
COMPONENTS=(etcd kube-apiserver kube-scheduler gpushare-scheduler kwok)
CLUSTER_LOG_NAME=kwok-cluster
CLUSTER_NAME=scale
APISERVER_URL="https://127.0.0.1:$APISERVER_PORT"
CERT_DAYS=30
# shellcheck source=hack/lib/cluster-common.sh
source "$here/lib/cluster-common.sh"

check_prereqs() {
  local b
  if [[ -n $PKI_FROM ]]; then
    for b in ca apiserver admin scheduler sa; do
      [[ -f $PKI_FROM/$b.key ]] || die "GPUSHARE_SCALE_PKI_DIR=$PKI_FROM has no $b.key; write it with: $0 pki DIR"
    done
  else
    command -v openssl >/dev/null || die "'openssl' not found; install it with: apt-get install openssl (or set GPUSHARE_SCALE_PKI_DIR)"
  fi
  if [[ -n $BIN_DIR ]]; then
    for b in kube-apiserver kube-scheduler etcd kwok; do
      [[ -x $BIN_DIR/$b ]] || die "GPUSHARE_SCALE_BIN_DIR=$BIN_DIR has no executable $b; put it there or unset the variable to build it"
    done
    return 0
  fi
  for b in kube-apiserver kube-scheduler kubectl; do
    [[ -x $KUBE_BIN/$b ]] || { log "kubernetes $KUBE_VERSION binaries missing; building them"; KUBE_VERSION=$KUBE_VERSION "$here/build-tools.sh" kube; break; }
  done
  [[ -x $ETCD_BIN/etcd ]] || "$here/build-tools.sh" etcd
  [[ -x $KWOK_BIN/kwok ]] || "$here/build-tools.sh" kwok
}

# ---------------------------------------------------------------------------------------------
# PKI and kubeconfigs (the scheme of hack/lib/cluster-common.sh, with a CA of its own)

make_pki() {
  mkdir -p "$PKI"
  chmod 700 "$PKI"
  if [[ -n $PKI_FROM ]]; then
    cp "$PKI_FROM"/*.crt "$PKI_FROM"/*.key "$PKI_FROM"/sa.pub "$PKI/"
  else
    generate_pki
  fi
  kubeconfig admin admin
  kubeconfig scheduler scheduler
}

generate_pki() { # into $PKI
  openssl genrsa -out "$PKI/ca.key" 2048 2>/dev/null
  openssl req -x509 -new -key "$PKI/ca.key" -subj "/CN=gpushare-scale-ca" -days 30 \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -out "$PKI/ca.crt" 2>/dev/null
  mkcert apiserver kube-apiserver "" "DNS:localhost,IP:127.0.0.1"
  mkcert admin kubernetes-admin system:masters ""
  mkcert scheduler system:kube-scheduler "" ""
  openssl genrsa -out "$PKI/sa.key" 2048 2>/dev/null
  openssl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
}

# HTTPS GET of URL, printing the body: curl where there is one, else python3 (with the admin
# client certificate), so the probes below work on a machine with neither curl nor kubectl.
https_get() { # URL
  if command -v curl >/dev/null; then
    curl -sk --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" "$1"
    return
  fi
  python3 - "$1" "$PKI/admin.crt" "$PKI/admin.key" <<'PY'
import ssl, sys, urllib.request
ctx = ssl.create_default_context()
ctx.check_hostname = False
ctx.verify_mode = ssl.CERT_NONE
ctx.load_cert_chain(sys.argv[2], sys.argv[3])
print(urllib.request.urlopen(sys.argv[1], context=ctx, timeout=5).read().decode(), end="")
PY
}

apiserver_ready() {
  if [[ -x $KUBE_BIN/kubectl ]]; then kubectl_admin get --raw /readyz
  else [[ $(https_get "https://127.0.0.1:$APISERVER_PORT/readyz") == ok ]]; fi
}

# ---------------------------------------------------------------------------------------------

start_etcd() {
  local etcd_extra=()
  # Off by default: a production etcd fsyncs. On for runs that must not measure a shared disk.
  [[ ${GPUSHARE_SCALE_ETCD_NO_FSYNC:-0} == 1 ]] && etcd_extra+=(--unsafe-no-fsync)
  mkdir -p "$STATE/etcd"
  chmod 700 "$STATE/etcd"
  start etcd "$ETCD_BIN/etcd" --name scale --data-dir "$STATE/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_CLIENT_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_CLIENT_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "scale=http://127.0.0.1:$ETCD_PEER_PORT" --listen-metrics-urls "http://127.0.0.1:$ETCD_METRICS_PORT" \
    --quota-backend-bytes 4294967296 --snapshot-count 50000 "${etcd_extra[@]}"
  wait_for etcd 30 bash -c "exec 3<>/dev/tcp/127.0.0.1/$ETCD_CLIENT_PORT"
}

start_apiserver() {
  # No Node authorizer / NodeRestriction: no kubelet talks to this API server. No
  # TaintNodesByCondition: it taints new nodes not-ready and only the controller-manager's node
  # lifecycle controller (not run here) would lift the taint once kwok reports Ready.
  start kube-apiserver "$KUBE_BIN/kube-apiserver" \
    --etcd-servers "http://127.0.0.1:$ETCD_CLIENT_PORT" \
    --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$APISERVER_PORT" \
    --endpoint-reconciler-type none --service-cluster-ip-range 10.97.0.0/16 \
    --client-ca-file "$PKI/ca.crt" --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
    --service-account-key-file "$PKI/sa.pub" --service-account-signing-key-file "$PKI/sa.key" \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --authorization-mode RBAC --disable-admission-plugins TaintNodesByCondition \
    --profiling=false --event-ttl 10m \
    --max-requests-inflight 1600 --max-mutating-requests-inflight 800 "${FEATURE_GATES[@]}"
  wait_for kube-apiserver 90 apiserver_ready
}

write_scheduler_configs() {
  write_scheduler_configs_with "$SCHED_QPS" "$SCHED_QPS" "$GPUSHARE_NODES_PERCENT"
}

start_schedulers() {
  write_scheduler_configs
  start kube-scheduler "$KUBE_BIN/kube-scheduler" --config "$STATE/kube-scheduler.yaml" \
    --authentication-kubeconfig "$STATE/scheduler.kubeconfig" --authorization-kubeconfig "$STATE/scheduler.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "$KUBE_SCHEDULER_PORT" "${FEATURE_GATES[@]}"
  start gpushare-scheduler "$KUBE_BIN/kube-scheduler" --config "$STATE/gpushare-scheduler.yaml" \
    --authentication-kubeconfig "$STATE/scheduler.kubeconfig" --authorization-kubeconfig "$STATE/scheduler.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "$GPUSHARE_SCHEDULER_PORT" "${FEATURE_GATES[@]}"
}

start_kwok() {
  # Default kwok stages: node-initialize (Ready, keeps the capacity we set), node heartbeat
  # through leases, pod-ready (bound pods become Running), pod-complete, pod-delete. kwok plays
  # pod stages with 4 workers by default, too few to keep up with hundreds of binds a second:
  # pods would turn Running seconds late, and gpushare's bind gate waits for exactly that.
  # Each worker waits for its status PATCH, which takes up to a second on a saturated API
  # server, so kwok's rate is about workers / PATCH latency: with 32 workers pods turned
  # Running 10-40 s after their bind in both the stock and the extender phases; 256 keeps up.
  cat >"$STATE/kwok.yaml" <<EOF
apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokConfiguration
options:
  podPlayStageParallelism: ${KWOK_POD_WORKERS}
  nodePlayStageParallelism: 8
  nodeLeaseParallelism: 8
EOF
  start kwok "$KWOK_BIN/kwok" --kubeconfig "$STATE/admin.kubeconfig" --config "$STATE/kwok.yaml" \
    --manage-nodes-with-annotation-selector "$KWOK_NODE_SELECTOR" \
    --cidr 10.98.0.1/16 --node-ip 10.99.0.1 --node-lease-duration-seconds 40
}

scheduler_healthy() { # PORT
  [[ $(https_get "https://127.0.0.1:$1/healthz" 2>/dev/null) == ok ]]
}

cmd_up() {
  local t0=$SECONDS c alive=0 port
  check_prereqs
  for c in "${COMPONENTS[@]}"; do pid_alive "$c" && alive=$((alive + 1)); done
  ((alive == 0)) || die "already running ($alive components); run '$0 down' first"
  [[ -d $STATE ]] && cmd_down
  for port in $ETCD_CLIENT_PORT $ETCD_PEER_PORT $ETCD_METRICS_PORT $APISERVER_PORT $KUBE_SCHEDULER_PORT $GPUSHARE_SCHEDULER_PORT; do
    port_free "$port" || die "port $port on 127.0.0.1 is taken by another process; free it first"
  done
  mkdir -p "$STATE" "$RUN" "$LOGS"
  make_pki
  start_etcd
  start_apiserver
  start_schedulers
  start_kwok
  wait_for "kube-scheduler /healthz" 60 scheduler_healthy "$KUBE_SCHEDULER_PORT"
  wait_for "gpushare-scheduler /healthz" 60 scheduler_healthy "$GPUSHARE_SCHEDULER_PORT"
  log "up in $((SECONDS - t0))s; use: eval \"\$($0 env)\""
}

cmd_down() {
  local c
  for c in kwok gpushare-scheduler kube-scheduler kube-apiserver etcd; do stop_component "$c"; done
  rm -rf "$STATE"
  log "down; state removed"
}

cmd_status() {
  local c rc=0
  for c in "${COMPONENTS[@]}"; do
    if pid_alive "$c"; then printf '%-20s running (pid %s)\n' "$c" "$(cat "$RUN/$c.pid")"
    else printf '%-20s stopped\n' "$c"; rc=1; fi
  done
  if pid_alive kube-apiserver; then
    printf 'nodes: %s\n' "$(kubectl_admin get nodes --no-headers 2>/dev/null | wc -l)"
  fi
  return $rc
}

cmd_pki() { # DIR
  [[ -n ${1:-} ]] || die "usage: $0 pki DIR"
  [[ ! -e $1 ]] || [[ -z $(ls -A "$1") ]] || die "$1 is not empty; give a new directory"
  command -v openssl >/dev/null || die "'openssl' not found; install it with: apt-get install openssl"
  PKI=$1 CERT_DAYS=30
  mkdir -p "$PKI"
  chmod 700 "$PKI"
  generate_pki
  log "PKI written to $PKI (valid $CERT_DAYS days); use: GPUSHARE_SCALE_PKI_DIR=$PKI"
}

cmd_env() {
  echo "export KUBECONFIG=$STATE/admin.kubeconfig"
  echo "export PATH=$KUBE_BIN:$KWOK_BIN:\$PATH"
  echo "export GPUSHARE_SCALE_STATE_DIR=$STATE"
}

case ${1:-} in
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  env) cmd_env ;;
  pki) cmd_pki "${2:-}" ;;
  -h|--help|help) sed -n '2,31p' "$0" | sed 's/^# \{0,1\}//' ;;
  *) sed -n '2,31p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
