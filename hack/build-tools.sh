#!/usr/bin/env bash
# Build the local cluster's binaries from the Go module proxy and cache them outside the repo.
#
#   hack/build-tools.sh [TARGET...]   (default: all)
# Targets: kube (Kubernetes $KUBE_VERSION, the device-plugin mode's), kube-dra ($DRA_KUBE_VERSION,
# the DRA mode's), etcd, helm, kwok, prometheus-operator (with Prometheus), containerd (the DRA
# mode's), kueue (with its CRDs and webhook manifests); demo: what `make demo` runs (etcd, kube,
# helm); all: every one of them.
#
# Go: hack/lib/go.sh puts a Go >= $GO_MIN_VERSION on PATH, fetching Go $GO_VERSION through the
# module proxy when the one installed is older (Debian 12's golang-go is 1.19).
#
# Kubernetes and etcd publish their server binaries from modules whose go.mod replaces
# sibling modules with relative paths (./staging/src/k8s.io/api, ../api), so `go install
# pkg@version` refuses them. We build each through a small wrapper module that requires the
# upstream module and pins every replaced sibling to its matching published release; the
# replace list is generated from the downloaded go.mod, not hard-coded.
#
# Several targets at once: while one compiles, the modules of the next download in the
# background. Compiler flags: GO_BUILD_FLAGS (hack/lib/go.sh).
#
# Binaries land in $GPUSHARE_CACHE_DIR/bin/<tool>-<version>/ and are reused while the
# version is unchanged. Set GOSUMDB=off only if checksum lookups fail on your network; the
# module proxy still serves the same content (see docs/development.md).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=hack/lib/versions.sh
source "$here/lib/versions.sh"

log() { printf '%s build-tools: %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# shellcheck source=hack/lib/go.sh
source "$here/lib/go.sh"
use_go

export CGO_ENABLED=0 GOFLAGS="${GOFLAGS:--buildvcs=false}"

# wrapper_module DIR MODULE VERSION SIBLING_VERSION
# Writes DIR/go.mod requiring MODULE@VERSION and pinning each relative replace of MODULE's
# go.mod to the same module path at SIBLING_VERSION.
wrapper_module() {
  local dir=$1 module=$2 version=$3 sibling_version=$4 gomod
  mkdir -p "$dir"
  printf 'module gpushare.local/build/%s\n' "$(basename "$dir")" >"$dir/go.mod"
  gomod=$(cd "$dir" && GOFLAGS=-mod=mod go mod download -json "$module@$version" |
    sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
  [[ -f $gomod ]] || die "could not download $module@$version from the module proxy"
  {
    echo "module gpushare.local/build/$(basename "$dir")"
    echo
    echo "go $(go env GOVERSION | sed 's/^go\([0-9]*\.[0-9]*\).*/\1/')"
    echo
    echo "require $module $version"
    echo
    echo "replace ("
    # Lines like "	k8s.io/api => ./staging/src/k8s.io/api" or "go.etcd.io/etcd/api/v3 => ../api".
    # The sibling's version is the one upstream requires, unless that is the v0.0.0
    # placeholder Kubernetes uses for staging modules.
    awk '$2 == "=>" && ($3 ~ /^\.\.?\//) && $3 !~ /FORBIDDEN/ {print $1}' "$gomod" | sort -u |
      while read -r sib; do
        local req
        req=$(awk -v m="$sib" '($1 == m || ($1 == "require" && $2 == m)) && $0 !~ /=>/ {print ($1 == m ? $2 : $3); exit}' "$gomod")
        [[ -z $req || $req == v0.0.0 ]] && req=$sibling_version
        printf '\t%s => %s %s\n' "$sib" "$sib" "$req"
      done
    # Replaces that pin another published version (Prometheus pins fsnotify) apply as written.
    sed -n 's/^\(replace[[:space:]]\)\{0,1\}[[:space:]]*\([^ ]\{1,\}\( v[^ ]*\)\{0,1\} => [^.][^ ]* v[^ ]*\)[[:space:]]*$/\t\2/p' "$gomod"
    echo ")"
  } >"$dir/go.mod"
}

# build_from DIR OUTDIR LDFLAGS PKG...: one `go build` for all of them, so the packages they
# share compile once and in parallel (a cold Kubernetes build is mostly that). The binaries are
# written to a scratch directory, then moved, so an interrupted build never leaves a
# half-written binary in the cache.
build_from() {
  local dir=$1 out=$2 ldflags=$3; shift 3
  local tmp="$out.partial"
  if ((PREFETCH)); then
    (cd "$dir" && GOFLAGS="$GOFLAGS -mod=mod" go build -n "${GO_BUILD_FLAGS[@]}" -ldflags "$ldflags" -o "$tmp/" "$@")
    return
  fi
  rm -rf "$tmp"; mkdir -p "$tmp" "$out"
  log "go build $*"
  (cd "$dir" && GOFLAGS="$GOFLAGS -mod=mod" go build "${GO_BUILD_FLAGS[@]}" -ldflags "$ldflags" -o "$tmp/" "$@")
  mv "$tmp"/* "$out/"
  rmdir "$tmp"
}

KUBE_CMDS=(kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl kube-proxy)

# kube_dra: build_kube for the DRA mode's release, in a subshell so KUBE_VERSION stays.
build_kube_dra() {
  (KUBE_VERSION=$DRA_KUBE_VERSION KUBE_STAGING_VERSION="v0${DRA_KUBE_VERSION#v1}" build_kube)
}

build_kube() {
  local out="$GPUSHARE_CACHE_DIR/bin/kubernetes-$KUBE_VERSION" missing=() cmd
  for cmd in "${KUBE_CMDS[@]}"; do [[ -x $out/$cmd ]] || missing+=("k8s.io/kubernetes/cmd/$cmd"); done
  if ((${#missing[@]} == 0)); then log "kubernetes $KUBE_VERSION cached in $out"; return; fi
  local dir="$GPUSHARE_CACHE_DIR/src/kubernetes-$KUBE_VERSION"
  log "building kubernetes $KUBE_VERSION (staging modules at $KUBE_STAGING_VERSION): ${missing[*]##*/}"
  log "a cold build takes about 5-7 min on 2 cores, longer while other work shares them (docs/development.md, \"How long\")"
  wrapper_module "$dir" k8s.io/kubernetes "$KUBE_VERSION" "$KUBE_STAGING_VERSION"
  local minor=${KUBE_VERSION#v1.}; minor=${minor%%.*}
  local ld="-s -w" pkg
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ld+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  build_from "$dir" "$out" "$ld" "${missing[@]}"
}

build_etcd() {
  local out="$GPUSHARE_CACHE_DIR/bin/etcd-$ETCD_VERSION"
  if [[ -x $out/etcd ]]; then log "etcd $ETCD_VERSION cached in $out"; return; fi
  local dir="$GPUSHARE_CACHE_DIR/src/etcd-$ETCD_VERSION"
  log "building etcd $ETCD_VERSION"
  wrapper_module "$dir" go.etcd.io/etcd/server/v3 "$ETCD_VERSION" "$ETCD_VERSION"
  build_from "$dir" "$out" "-s -w" go.etcd.io/etcd/server/v3
  ((PREFETCH == 0)) || return 0
  # The go command names the binary of a .../v3 package after the element before the suffix.
  local built
  for built in server v3; do [[ -x $out/$built ]] && mv "$out/$built" "$out/etcd"; done
  [[ -x $out/etcd ]] || die "the etcd build wrote no binary into $out"
}

# go_install OUTDIR ARG...: `go install ARG...` into the scratch directory OUTDIR.partial, which
# the caller moves to OUTDIR once complete; in a prefetch, only its downloads (-n).
go_install() {
  local out=$1; shift
  if ((PREFETCH)); then GOBIN="$out.partial" go install -n "${GO_BUILD_FLAGS[@]}" "$@"; return; fi
  local pkgs=() arg
  for arg in "$@"; do [[ $arg == *@* ]] && pkgs+=("$arg"); done
  log "go install ${pkgs[*]}"
  rm -rf "$out.partial"; mkdir -p "$out.partial"
  GOBIN="$out.partial" go install "${GO_BUILD_FLAGS[@]}" "$@"
}

build_go_install() { # NAME VERSION PKG
  local name=$1 version=$2 pkg=$3 out="$GPUSHARE_CACHE_DIR/bin/$1-$2"
  if [[ -x $out/$name ]]; then log "$name $version cached in $out"; return; fi
  go_install "$out" -ldflags "-s -w" "$pkg@$version"
  ((PREFETCH == 0)) || return 0
  rm -rf "$out"; mv "$out.partial" "$out"
}

# containerd (daemon, runc shim and ctr) for the local cluster's DRA mode: the distribution's
# containerd may predate CDI (1.7). Its module has no relative replaces, so `go install` builds
# it; without cgo the btrfs snapshotter is left out (no_btrfs), which the cluster disables anyway.
build_containerd() {
  local v=$CONTAINERD_VERSION out="$GPUSHARE_CACHE_DIR/bin/containerd-$CONTAINERD_VERSION"
  local module=github.com/containerd/containerd/v2
  if [[ -x $out/containerd && -x $out/containerd-shim-runc-v2 && -x $out/ctr ]]; then
    log "containerd $v cached in $out"; return
  fi
  go_install "$out" -tags "no_btrfs osusergo netgo" \
    -ldflags "-s -w -X $module/version.Version=$v -X $module/version.Package=$module" \
    "$module/cmd/containerd@$v" "$module/cmd/containerd-shim-runc-v2@$v" "$module/cmd/ctr@$v"
  ((PREFETCH == 0)) || return 0
  rm -rf "$out"; mv "$out.partial" "$out"
}

# Prometheus itself, for the Prometheus Operator test: Debian's package is built without
# kubernetes_sd_configs, which every ServiceMonitor needs. Its go.mod pins one dependency with
# a replace, so it is built through a wrapper module like the others (no web UI assets: the
# tests use its HTTP API). promtool, from the same module, unit-tests the chart's alert rules.
build_prometheus() {
  local v=$PROMETHEUS_VERSION out="$GPUSHARE_CACHE_DIR/bin/prometheus-$PROMETHEUS_VERSION" missing=()
  local cmd
  for cmd in prometheus promtool; do
    [[ -x $out/$cmd ]] || missing+=("github.com/prometheus/prometheus/cmd/$cmd")
  done
  if ((${#missing[@]} == 0)); then log "prometheus $v cached in $out"; return; fi
  local dir="$GPUSHARE_CACHE_DIR/src/prometheus-$v"
  log "building prometheus $v (module version $PROMETHEUS_MODULE_VERSION)"
  wrapper_module "$dir" github.com/prometheus/prometheus "$PROMETHEUS_MODULE_VERSION" "$PROMETHEUS_MODULE_VERSION"
  build_from "$dir" "$out" "-s -w -X github.com/prometheus/common/version.Version=${v#v}" \
    "${missing[@]}"
}

# The Prometheus Operator's module replaces its own pkg/apis/monitoring and pkg/client with
# relative paths, like etcd; its CRDs ship inside the module (example/prometheus-operator-crd)
# and are copied next to the binaries so tests install exactly the version that runs.
build_prometheus_operator() {
  local v=$PROMETHEUS_OPERATOR_VERSION out="$GPUSHARE_CACHE_DIR/bin/prometheus-operator-$PROMETHEUS_OPERATOR_VERSION"
  local module=github.com/prometheus-operator/prometheus-operator
  if [[ -x $out/operator && -x $out/prometheus-config-reloader && -d $out/crds ]]; then
    log "prometheus-operator $v cached in $out"; return
  fi
  local dir="$GPUSHARE_CACHE_DIR/src/prometheus-operator-$v"
  log "building prometheus-operator $v"
  wrapper_module "$dir" "$module" "$v" "$v"
  build_from "$dir" "$out" "-s -w -X github.com/prometheus/common/version.Version=${v#v}" \
    "$module/cmd/operator" "$module/cmd/prometheus-config-reloader"
  ((PREFETCH == 0)) || return 0
  local src
  src=$(cd "$dir" && GOFLAGS=-mod=mod go list -m -f '{{.Dir}}' "$module")
  rm -rf "$out/crds.partial"; mkdir -p "$out/crds.partial"
  cp "$src"/example/prometheus-operator-crd/monitoring.coreos.com_*.yaml "$out/crds.partial/"
  chmod -R u+w "$out/crds.partial"
  rm -rf "$out/crds"; mv "$out/crds.partial" "$out/crds"
}

# Kueue's manager, for tests/cluster/test_kueue_cluster.py (docs/queues.md). Its module has no
# relative replaces, so `go install` builds it. Its CRDs and webhook manifests ship inside the
# module (config/components) and are copied next to the binary, so the test installs exactly
# the version that runs.
build_kueue() {
  local v=$KUEUE_VERSION out="$GPUSHARE_CACHE_DIR/bin/kueue-$KUEUE_VERSION" module=sigs.k8s.io/kueue
  if [[ -x $out/kueue && -d $out/crds && -f $out/webhooks.yaml ]]; then
    log "kueue $v cached in $out"; return
  fi
  go_install "$out" -ldflags "-s -w -X $module/pkg/version.GitVersion=$v" "$module/cmd/kueue@$v"
  ((PREFETCH == 0)) || return 0
  mkdir -p "$out.partial/crds"
  local src
  src=$(GOFLAGS=-mod=mod go mod download -json "$module@$v" |
    sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  [[ -d $src/config/components/crd/bases ]] || die "no CRDs in the $module@$v module ($src)"
  cp "$src"/config/components/crd/bases/*.yaml "$out.partial/crds/"
  cp "$src"/config/components/webhook/manifests.yaml "$out.partial/webhooks.yaml"
  chmod -R u+w "$out.partial"
  rm -rf "$out"; mv "$out.partial" "$out"
}

build_one() { # TARGET (a single one, see targets_of)
  case $1 in
    kube) build_kube ;;
    kube-dra) build_kube_dra ;;
    etcd) build_etcd ;;
    helm) build_go_install helm "$HELM_VERSION" helm.sh/helm/v3/cmd/helm ;;
    kwok) build_go_install kwok "$KWOK_VERSION" sigs.k8s.io/kwok/cmd/kwok ;;
    prometheus-operator) build_prometheus_operator; build_prometheus ;;
    containerd) build_containerd ;;
    kueue) build_kueue ;;
  esac
}

targets_of() { # TARGET -> the single targets it stands for, in build order
  case $1 in
    demo) echo etcd kube helm ;;
    all) echo etcd kube helm kube-dra kwok prometheus-operator containerd kueue ;;
    kube | kube-dra | etcd | helm | kwok | prometheus-operator | containerd | kueue) echo "$1" ;;
    *) die "unknown target '$1'; use any of: all demo kube kube-dra etcd helm kwok prometheus-operator containerd kueue" ;;
  esac
}

# Downloads overlap compiling. A cold `go build` first downloads the modules it lacks, leaving
# the cores mostly idle, then compiles on all of them (about 30 s of downloads for Kubernetes and
# helm in a cold `make demo`: docs/development.md, "How long"). So while one target builds, the
# next one runs in the background with PREFETCH=1: its go commands get -n, which loads every
# package, downloading the modules it needs, and compiles, writes and moves nothing. One
# download at a time, each shorter than the build it overlaps, keeps memory to two go commands.
# A target's build waits for its download first; a download that failed is only logged, as the
# build then downloads what is missing and reports any error itself.
PREFETCH=0
declare -A prefetching=()  # target -> PID of its background download

prefetch() { # TARGET
  local log_file="$GPUSHARE_CACHE_DIR/src/prefetch-$1.log"
  mkdir -p "$GPUSHARE_CACHE_DIR/src"
  (PREFETCH=1 build_one "$1") >"$log_file" 2>&1 &
  prefetching[$1]=$!
}

await_prefetch() { # TARGET
  local pid=${prefetching[$1]:-}
  [[ -n $pid ]] || return 0
  unset "prefetching[$1]"
  local log_file="$GPUSHARE_CACHE_DIR/src/prefetch-$1.log"
  if wait "$pid"; then rm -f "$log_file"; return; fi
  log "downloading the modules of $1 in the background failed; its build downloads them (see $log_file)"
}

case ${1:-} in
  -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
esac
what=("${@:-all}")
targets=()
for target in "${what[@]}"; do
  singles=$(targets_of "$target") || exit 1
  for single in $singles; do [[ " ${targets[*]} " == *" $single "* ]] || targets+=("$single"); done
done
for i in "${!targets[@]}"; do
  await_prefetch "${targets[i]}"
  if ((i + 1 < ${#targets[@]})); then prefetch "${targets[i + 1]}"; fi
  build_one "${targets[i]}"
done
log "done: ${what[*]}"
