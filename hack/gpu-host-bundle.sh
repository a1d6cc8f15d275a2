#!/usr/bin/env bash
# Pack everything the local cluster needs onto a GPU machine that has no container runtime, no
# registry and no network: Kubernetes and etcd binaries, helm, containerd, runc, CNI plugins,
# ip and iptables (with the shared libraries they link beyond glibc), and the images the chart
# and the tests use. hack/gpu-host-e2e.sh unpacks it there and runs the real-GPU cluster tests.
#
#   hack/gpu-host-bundle.sh [--mode deviceplugin|dra] [--out DIR] [--chunk-mib N]
#
# --mode dra carries what the local cluster's DRA mode runs instead: Kubernetes
# $DRA_KUBE_VERSION and containerd $CONTAINERD_VERSION with CDI (hack/build-tools.sh kube-dra
# containerd) in place of Kubernetes $KUBE_VERSION and the distribution's containerd; run it
# with hack/gpu-host-e2e.sh --mode dra.
#
# Writes DIR/gpu-host-bundle.tar.xz.part-aa, -ab, ... (each at most N MiB, default 55, for
# transports that limit a single transfer) and DIR/SHA256SUMS. Join them on the GPU machine
# with `cat DIR/gpu-host-bundle.tar.xz.part-* | xz -d | tar -x`, or let gpu-host-e2e.sh do it.
#
# Binaries are carried as built (the cached Kubernetes, etcd and helm builds are linked with
# -s -w already) and xz-compressed. Programs that link more than glibc (runc: libseccomp;
# ip: libbpf, libmnl...; iptables: libxtables, libnftnl...) are carried with those libraries
# and started through a small wrapper setting LD_LIBRARY_PATH for them alone, so the GPU
# machine's own programs never load this machine's libraries. glibc itself is not carried: the
# target must have one at least as new as this machine's (`ldd --version`).
#
# Settings (environment): GPUSHARE_CACHE_DIR (binaries and images, see hack/build-tools.sh and
# hack/build-image.sh). Needs the cluster binaries (hack/build-tools.sh kube etcd helm), the
# gpushare image (hack/build-image.sh gpushare --no-import) and this machine's containerd,
# runc, CNI plugins, iproute2, iptables and busybox (hack/install-prereqs.sh).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
# shellcheck source=hack/lib/versions.sh
source "$here/lib/versions.sh"

log() { printf '%s gpu-host-bundle: %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }
# shellcheck source=hack/lib/go.sh
source "$here/lib/go.sh"  # GO_BUILD_FLAGS, for the pause binary

out="" chunk_mib=55 mode=deviceplugin
while (($#)); do
  case $1 in
    --mode) mode=$2; shift ;;
    --out) out=$2; shift ;;
    --chunk-mib) chunk_mib=$2; shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
  shift
done
[[ $chunk_mib =~ ^[1-9][0-9]*$ ]] || die "--chunk-mib must be a positive whole number of MiB, got '$chunk_mib'"
[[ $mode == deviceplugin || $mode == dra ]] || die "--mode must be deviceplugin or dra, got '$mode'"
[[ -n $out ]] || out="$GPUSHARE_CACHE_DIR/gpu-host-bundle$([[ $mode == dra ]] && echo -dra)"

BUNDLE_KUBE_VERSION=$(kube_version_for "$mode")
KUBE_BIN="$GPUSHARE_CACHE_DIR/bin/kubernetes-$BUNDLE_KUBE_VERSION"
CONTAINERD_BIN="$GPUSHARE_CACHE_DIR/bin/containerd-$CONTAINERD_VERSION"
ETCD_BIN="$GPUSHARE_CACHE_DIR/bin/etcd-$ETCD_VERSION"
HELM_BIN="$GPUSHARE_CACHE_DIR/bin/helm-$HELM_VERSION"
IMAGES="$GPUSHARE_CACHE_DIR/images"
CNI_SRC="${GPUSHARE_CNI_BIN_DIR:-/usr/lib/cni}"
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' "$repo/pyproject.toml" | head -1)
GPUSHARE_ARCHIVE="$IMAGES/gpushare-$VERSION.tar"

stage=$(mktemp -d "${TMPDIR:-/tmp}/gpu-host-bundle.XXXXXX")
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage"/{bin,libexec,lib,cni,images}

# carry_static NAME SRC : a binary that links glibc at most
carry_static() {
  [[ -x $2 ]] || die "$2 missing (see --help for how to build or install it)"
  cp -L "$2" "$stage/bin/$1"
}

# extra_libs BINARY : the shared libraries it links beyond glibc and the dynamic loader
extra_libs() {
  ldd "$1" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3}' |
    grep -Ev '/(libc|libm|libpthread|libdl|librt|libresolv)\.so' || true
}

# carry_wrapped NAME SRC [ALIAS...] : SRC with its extra libraries in lib/, started by a
# wrapper bin/NAME (and bin/ALIAS symlinks to it) that sets LD_LIBRARY_PATH for it alone and
# keeps the name it was called by (xtables-nft-multi picks its tool from argv[0]).
carry_wrapped() {
  local name=$1 src=$2 lib; shift 2
  [[ -x $src ]] || die "$src missing (see --help for how to install it)"
  cp -L "$src" "$stage/libexec/$(basename "$src")"
  for lib in $(extra_libs "$src"); do cp -Ln "$lib" "$stage/lib/" 2>/dev/null || true; done
  cat >"$stage/bin/$name" <<EOF
#!/bin/bash
# Runs $(basename "$src") with the libraries carried beside it (hack/gpu-host-bundle.sh).
d=\$(cd "\$(dirname "\$(readlink -f "\${BASH_SOURCE[0]}")")/.." && pwd)
LD_LIBRARY_PATH=\$d/lib XTABLES_LIBDIR=\$d/lib/xtables exec -a "\$(basename "\$0")" "\$d/libexec/$(basename "$src")" "\$@"
EOF
  chmod 755 "$stage/bin/$name"
  local alias
  for alias in "$@"; do ln -s "$name" "$stage/bin/$alias"; done
}

log "binaries ($mode mode): Kubernetes $BUNDLE_KUBE_VERSION, etcd $ETCD_VERSION, helm $HELM_VERSION"
for b in kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl kube-proxy; do
  carry_static "$b" "$KUBE_BIN/$b"
done
carry_static etcd "$ETCD_BIN/etcd"
carry_static helm "$HELM_BIN/helm"

log "container runtime: containerd, its runc shim, ctr, runc; CNI plugins from $CNI_SRC"
for b in containerd containerd-shim-runc-v2 ctr; do
  if [[ $mode == dra ]]; then
    # The DRA mode's containerd (CDI on), built from source: static Go binaries.
    carry_static "$b" "$CONTAINERD_BIN/$b"
    continue
  fi
  src=$(command -v "$b") || die "$b not found; install it with hack/install-prereqs.sh"
  if [[ -n $(extra_libs "$src") ]]; then carry_wrapped "$b" "$src"; else carry_static "$b" "$src"; fi
done
carry_wrapped runc "$(command -v runc || die 'runc not found; install it with hack/install-prereqs.sh')"
for p in bridge host-local loopback portmap; do
  [[ -x $CNI_SRC/$p ]] || die "CNI plugin $CNI_SRC/$p missing; install with hack/install-prereqs.sh"
  cp -L "$CNI_SRC/$p" "$stage/cni/$p"
done

log "network tools: ip, iptables (nft backend) and their libraries"
carry_wrapped ip "$(command -v ip || die 'ip not found; apt-get install iproute2')"
xt=$(readlink -f "$(command -v iptables || die 'iptables not found; apt-get install iptables')")
[[ $(basename "$xt") == xtables-nft-multi ]] || die "iptables is $xt; the bundle carries the nft backend (update-alternatives --set iptables /usr/sbin/iptables-nft)"
carry_wrapped iptables "$xt" iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore
xtlib=$(dirname "$(ldd "$xt" | awk '/libxtables/ {print $3}')")/xtables
[[ -d $xtlib ]] || die "iptables extensions not found in $xtlib"
cp -r "$xtlib" "$stage/lib/xtables"

log "images: pause, busybox, gpushare $VERSION"
if [[ ! -x $IMAGES/pause ]]; then
  command -v go >/dev/null || die "the pause binary is not built and go is missing; run hack/local-cluster.sh up once"
  mkdir -p "$IMAGES"
  (cd "$here/images/pause" && CGO_ENABLED=0 go build "${GO_BUILD_FLAGS[@]}" -ldflags "-s -w" -o "$IMAGES/pause" .)
fi
python3 "$here/lib/image_archive.py" --ref registry.k8s.io/pause:3.10.1 --out "$stage/images/pause.tar" \
  --add "$IMAGES/pause:/pause" --entrypoint /pause
links=()
for applet in $(busybox --list); do
  [[ $applet == busybox ]] || links+=(--symlink "/bin/$applet:busybox")
done
python3 "$here/lib/image_archive.py" --ref gpushare.local/busybox:1.35 --out "$stage/images/busybox.tar" \
  --add "$(command -v busybox):/bin/busybox" "${links[@]}" --cmd sh
[[ -f $GPUSHARE_ARCHIVE ]] || die "$GPUSHARE_ARCHIVE missing; build it with: hack/build-image.sh gpushare --no-import"
# The image must hold the code the chart in this checkout was written for: a chart that passes
# flags an older controller does not know crash-loops it. Compare the image's revision label
# with HEAD over what goes into the image.
image_rev=$(python3 - "$GPUSHARE_ARCHIVE" <<'PY'
import json, sys, tarfile
with tarfile.open(sys.argv[1]) as tar:
    manifest = json.load(tar.extractfile("manifest.json"))
    config = json.load(tar.extractfile(manifest[0]["Config"]))
print((config.get("config", {}).get("Labels") or {}).get("org.opencontainers.image.revision", ""))
PY
)
rev=${image_rev%-dirty}
if [[ -z $rev ]] || ! git -C "$repo" diff --quiet "$rev" HEAD -- gpushare Dockerfile requirements.lock 2>/dev/null; then
  die "$GPUSHARE_ARCHIVE was built from revision '${image_rev:-unknown}', whose gpushare/ differs from this checkout's; rebuild it: hack/build-image.sh gpushare --no-import --force"
fi
[[ $image_rev == *-dirty ]] && log "warning: the gpushare image was built from a work tree with uncommitted changes ($image_rev)"
cp "$GPUSHARE_ARCHIVE" "$stage/images/gpushare.tar"
{
  containerd=$([[ $mode == dra ]] && echo "$CONTAINERD_VERSION" || echo distribution)
  echo "mode=$mode kubernetes=$BUNDLE_KUBE_VERSION containerd=$containerd etcd=$ETCD_VERSION helm=$HELM_VERSION gpushare=$VERSION"
  echo "revision=$(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown) image-revision=$image_rev"
  echo "glibc>=$(ldd --version | head -1 | awk '{print $NF}')"
} >"$stage/BUNDLE"

log "compressing $(du -sh "$stage" | cut -f1) with xz (a few minutes on two cores)"
mkdir -p "$out"
rm -f "$out"/gpu-host-bundle.tar.xz.part-* "$out/SHA256SUMS"
tar -C "$stage" -cf - . | xz -T0 -6 | split -b "${chunk_mib}M" - "$out/gpu-host-bundle.tar.xz.part-"
(cd "$out" && sha256sum gpu-host-bundle.tar.xz.part-* >SHA256SUMS)
log "wrote $(ls "$out"/gpu-host-bundle.tar.xz.part-* | wc -l) parts, $(du -ch "$out"/gpu-host-bundle.tar.xz.part-* | tail -1 | cut -f1) in all, to $out"
