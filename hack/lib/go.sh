# Go for the hack/ scripts that build (sourced by hack/build-tools.sh, hack/local-cluster.sh and
# hack/gpu-host-bundle.sh, after their log and die). The tools need Go >= $GO_MIN_VERSION: etcd's
# and helm's go.mod ask for 1.26. A distribution's Go is often older (Debian 12's golang-go is
# 1.19, Ubuntu 24.04's 1.22), so `use_go` puts a new enough Go first on PATH:
#   1. the `go` on PATH, when it is at least $GO_MIN_VERSION;
#   2. else Go $GO_VERSION from $GPUSHARE_CACHE_DIR/go-$GO_VERSION, fetched there once as the
#      module golang.org/toolchain (the module the go command itself fetches for GOTOOLCHAIN)
#      by whatever older Go is on PATH: any Go >= 1.16 can download it
#      (hack/install-prereqs.sh installs the distribution's golang-go when there is no Go).
# GOTOOLCHAIN=local then keeps the go command from switching to another toolchain on its own.
# shellcheck shell=bash

# Flags of every `go build` and `go install` of the hack/ scripts. -gcflags=all=-dwarf=false: the
# binaries are linked with -s -w, which drops the debug information (DWARF), so the compiler need
# not write it at all; the machine code is the same, and a cold build takes about a tenth less CPU
# (docs/development.md, "How long"). The same flags everywhere also let the small builds (the
# pause image) reuse the standard library the tool builds compiled.
GO_BUILD_FLAGS=(-trimpath -gcflags=all=-dwarf=false)

go_version_of() { # GO_BINARY -> 1.26.8
  "$1" env GOVERSION 2>/dev/null | sed -n 's/^go\([0-9][0-9.]*\).*/\1/p'
}

version_at_least() { # HAVE WANT
  [[ $(printf '%s\n%s\n' "$2" "$1" | sort -V | head -1) == "$2" ]]
}

use_go() {
  local have="" cached="$GPUSHARE_CACHE_DIR/go-$GO_VERSION"
  export GOTOOLCHAIN=local
  if command -v go >/dev/null; then have=$(go_version_of go); fi
  if [[ -n $have ]] && version_at_least "$have" "$GO_MIN_VERSION"; then return 0; fi
  if [[ ! -x $cached/bin/go ]]; then
    [[ -n $have ]] || die "no Go >= 1.16 on PATH; install the distribution's (hack/install-prereqs.sh: apt-get install golang-go), which then fetches Go $GO_VERSION"
    fetch_go "$cached"
  fi
  export PATH="$cached/bin:$PATH"
  [[ $(go_version_of go) == "$GO_VERSION" ]] || die "$cached/bin/go is not Go $GO_VERSION; remove $cached and retry"
}

# fetch_go DEST: Go $GO_VERSION for this host, as the module golang.org/toolchain, into DEST.
fetch_go() {
  local dest=$1 os arch work dir
  os=$(go env GOHOSTOS) arch=$(go env GOHOSTARCH)
  local module="golang.org/toolchain@v0.0.1-go$GO_VERSION.$os-$arch"
  log "Go $(go_version_of go) on PATH is older than $GO_MIN_VERSION; fetching Go $GO_VERSION ($module)"
  work=$(mktemp -d)
  printf 'module gpushare.local/build/go-toolchain\n' >"$work/go.mod"
  dir=$(cd "$work" && GO111MODULE=on GOFLAGS=-mod=mod go mod download -json "$module" |
    sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  rm -rf "$work"
  [[ -x $dir/bin/go || -f $dir/bin/go ]] || die "could not download $module from the module proxy"
  rm -rf "$dest.partial"
  mkdir -p "$(dirname "$dest")"
  cp -r "$dir" "$dest.partial"
  chmod -R u+w "$dest.partial"
  # Module zips carry no file modes: the go command marks these executable when it switches
  # toolchains itself, and so do we.
  chmod +x "$dest.partial"/bin/* "$dest.partial"/pkg/tool/*/*
  rm -rf "$dest"
  mv "$dest.partial" "$dest"
  log "Go $GO_VERSION in $dest"
}
