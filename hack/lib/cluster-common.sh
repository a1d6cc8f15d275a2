# Helpers shared by the hack/*-cluster.sh scripts: process start/stop by PID file, waiting,
# and the PKI + kubeconfig scheme (one CA per cluster, client certificates per component).
# Source it after setting:
#   CLUSTER_LOG_NAME  prefix of log lines (e.g. kwok-cluster)
#   CLUSTER_NAME      cluster and context name written into kubeconfigs
#   APISERVER_URL     API server URL written into kubeconfigs
#   STATE RUN PKI LOGS KUBE_BIN  state, PID, PKI and log directories; Kubernetes binaries
#   CERT_DAYS         validity of issued certificates (default 365)
# shellcheck shell=bash

log() { printf '%s %s: %s\n' "$(date -u +%H:%M:%S)" "$CLUSTER_LOG_NAME" "$*" >&2; }
die() { log "error: $*"; exit 1; }

pid_alive() { [[ -f $RUN/$1.pid ]] && kill -0 "$(cat "$RUN/$1.pid")" 2>/dev/null; }

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# start NAME CMD... : run detached in its own session, log to $LOGS/NAME.log, PID to $RUN/NAME.pid
start() {
  local name=$1; shift
  if pid_alive "$name"; then return 0; fi
  setsid "$@" >>"$LOGS/$name.log" 2>&1 </dev/null &
  echo $! >"$RUN/$name.pid"
  log "started $name (pid $!)"
}

stop_component() { # NAME [SIGNAL]
  local name=$1 sig=${2:-TERM} pid i
  [[ -f $RUN/$name.pid ]] || return 0
  pid=$(cat "$RUN/$name.pid")
  if kill -0 "$pid" 2>/dev/null; then
    kill "-$sig" "$pid" 2>/dev/null || true
    for i in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null || true
    log "stopped $name (pid $pid)"
  fi
  rm -f "$RUN/$name.pid"
}

wait_for() { # DESCRIPTION TIMEOUT_S CMD...
  local what=$1 timeout=$2 i; shift 2
  for ((i = 0; i < timeout * 5; i++)); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.2
  done
  die "timed out after ${timeout}s waiting for $what (logs: $LOGS)"
}

kubectl_admin() { "$KUBE_BIN/kubectl" --kubeconfig "$STATE/admin.kubeconfig" "$@"; }

mkcert() { # NAME CN ORG SANS(comma list or "") : signed by $PKI/ca.*; kept if it exists
  local name=$1 cn=$2 org=$3 sans=$4
  local subj="/CN=$cn" ext="$PKI/$name.ext"
  [[ -f $PKI/$name.crt ]] && return 0
  [[ -n $org ]] && subj="/O=$org/CN=$cn"
  openssl genrsa -out "$PKI/$name.key" 2048 2>/dev/null
  {
    echo "basicConstraints=CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=serverAuth,clientAuth"
    [[ -n $sans ]] && echo "subjectAltName=$sans"
  } >"$ext"
  openssl req -new -key "$PKI/$name.key" -subj "$subj" -out "$PKI/$name.csr" 2>/dev/null
  openssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial \
    -days "${CERT_DAYS:-365}" -extfile "$ext" -out "$PKI/$name.crt" 2>/dev/null
  rm -f "$PKI/$name.csr" "$ext"
}

kubeconfig() { # NAME CERT : $STATE/NAME.kubeconfig with client certificate CERT; kept if it exists
  local file="$STATE/$1.kubeconfig" cert=$2
  [[ -f $file ]] && return 0
  cat >"$file" <<KUBECONFIG
apiVersion: v1
kind: Config
clusters:
- name: $CLUSTER_NAME
  cluster:
    server: $APISERVER_URL
    certificate-authority: $PKI/ca.crt
users:
- name: $1
  user:
    client-certificate: $PKI/$cert.crt
    client-key: $PKI/$cert.key
contexts:
- name: $CLUSTER_NAME
  context: {cluster: $CLUSTER_NAME, user: $1}
current-context: $CLUSTER_NAME
KUBECONFIG
}

# write_scheduler_configs_with QPS BURST [NODES_PERCENT] : $STATE/kube-scheduler.yaml (the
# default profile) and $STATE/gpushare-scheduler.yaml: the stock kube-scheduler whose only
# profile is gpushare-scheduler and which asks the extender at $EXTENDER_URL to filter, score
# and bind every pod of that profile, its own resource fit counting gpushare.io/gpu-percent per
# node and the extender vetting its preemptions (as the chart configures it). NODES_PERCENT sets
# that profile's percentageOfNodesToScore (empty: kube-scheduler's adaptive default).
write_scheduler_configs_with() {
  local qps=$1 burst=$2 percent=""
  [[ -n ${3:-} ]] && percent="  percentageOfNodesToScore: $3"
  cat >"$STATE/kube-scheduler.yaml" <<YAML
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection: {kubeconfig: "$STATE/scheduler.kubeconfig", qps: $qps, burst: $burst}
leaderElection: {leaderElect: false}
profiles:
- schedulerName: default-scheduler
YAML
  cat >"$STATE/gpushare-scheduler.yaml" <<YAML
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection: {kubeconfig: "$STATE/scheduler.kubeconfig", qps: $qps, burst: $burst}
leaderElection: {leaderElect: false}
profiles:
- schedulerName: gpushare-scheduler
$percent
extenders:
- urlPrefix: "$EXTENDER_URL"
  filterVerb: filter
  prioritizeVerb: prioritize
  preemptVerb: preempt
  bindVerb: bind
  weight: 5
  nodeCacheCapable: true
  httpTimeout: 10s
  ignorable: false
YAML
}
