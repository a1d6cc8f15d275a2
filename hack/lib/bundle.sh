# shellcheck shell=bash
# Unpacking the bundle of hack/gpu-host-bundle.sh on the machine that runs it, and the
# environment that makes hack/local-cluster.sh run the carried binaries. Sourced by
# hack/gpu-host-e2e.sh and hack/bundle-host-pytest.sh; needs log() and die().

# bundle_unpack DIR WORK : check DIR's parts against its SHA256SUMS and unpack them into
# WORK/bundle (skipped when WORK/bundle already holds the same parts). Prints WORK/bundle.
bundle_unpack() {
  local bundle=$1 work=$2
  if [[ -f $work/bundle/BUNDLE && -f $work/bundle/SHA256SUMS ]] && cmp -s "$bundle/SHA256SUMS" "$work/bundle/SHA256SUMS"; then
    log "bundle already unpacked in $work/bundle"
  else
    [[ -f $bundle/SHA256SUMS ]] || die "$bundle/SHA256SUMS missing; copy every part and SHA256SUMS from hack/gpu-host-bundle.sh"
    (cd "$bundle" && sha256sum --quiet -c SHA256SUMS) >&2 || die "a bundle part is missing or damaged (sha256sum -c failed in $bundle)"
    rm -rf "$work/bundle"; mkdir -p "$work/bundle"
    log "unpacking the bundle into $work/bundle"
    cat "$bundle"/gpu-host-bundle.tar.xz.part-* | xz -d | tar -x -C "$work/bundle"
    cp "$bundle/SHA256SUMS" "$work/bundle/SHA256SUMS"
  fi
  echo "$work/bundle"
}

# bundle_env B MODE : after bundle_unpack, point hack/local-cluster.sh at B's binaries and
# images (the bundle must have been made for MODE: deviceplugin or dra).
bundle_env() {
  local B=$1 mode=$2 bundle_mode
  log "bundle: $(tr '\n' ' ' <"$B/BUNDLE")"
  bundle_mode=$(sed -n 's/^mode=\([a-z]*\) .*/\1/p' "$B/BUNDLE")
  [[ ${bundle_mode:-deviceplugin} == "$mode" ]] ||
    die "the bundle was made for mode ${bundle_mode:-deviceplugin}, not $mode: hack/gpu-host-bundle.sh --mode $mode"
  export GPUSHARE_CLUSTER_MODE=$mode
  if [[ $mode == dra ]]; then export GPUSHARE_CONTAINERD_BIN=$B/bin; fi
  export PATH="$B/bin:$PATH"
  export GPUSHARE_KUBE_BIN=$B/bin GPUSHARE_ETCD_BIN=$B/bin GPUSHARE_CNI_BIN_DIR=$B/cni
  export GPUSHARE_IMAGE_ARCHIVES=$B/images
}
