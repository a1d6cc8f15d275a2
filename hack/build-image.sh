#!/usr/bin/env bash
# Build the images the Helm chart names, offline, and import them into the local cluster.
#
#   hack/build-image.sh gpushare    the project's Dockerfile, built by buildah with no network
#   hack/build-image.sh scheduler   registry.k8s.io/kube-scheduler:<version> from the local
#                                   cluster's own kube-scheduler binary: KUBE_VERSION, or
#                                   DRA_KUBE_VERSION when the local cluster runs in dra mode
#   hack/build-image.sh all         both (default)
#
# Options: --tag REF (gpushare image, default gpushare/gpushare:<version in pyproject.toml>),
# --out FILE (docker-archive to write), --oci (write an OCI archive instead, as a release
# publishes it), --no-import (do not import into containerd), --force (rebuild even when
# nothing changed).
#
# There is no Docker engine and no registry here. The SAME Dockerfile a user builds with
# `docker build .` is built with `buildah bud --isolation chroot` inside a network namespace
# of its own (no network at all), with two differences, both outside the Dockerfile:
#   1. its base image (BASE_IMAGE, python:3.11-slim-bookworm pinned by digest) is a local
#      stand-in assembled from this Debian 12 host's packages and the CPython that built .venv
#      (hack/lib/python_base.py), passed as --build-arg BASE_IMAGE;
#   2. pip reads wheels from a wheelhouse repacked from .venv's installed distributions
#      (hack/lib/wheelhouse.py), bind-mounted into the build with an /etc/pip.conf saying
#      no-index + find-links. Neither lands in the image.
# The result is exported as a docker-archive and imported into the cluster's containerd
# (namespace k8s.io) under the tag the chart uses, so pods get it with imagePullPolicy
# IfNotPresent, as a user's cluster would from a registry.
#
# Settings (environment): GPUSHARE_CACHE_DIR (buildah storage, base image, archives),
# GPUSHARE_CONTAINERD_SOCKET (default: the local cluster's), GPUSHARE_PYTHON_PREFIX (CPython
# to copy into the base image; default: the one .venv was made from). Needs root and buildah
# (hack/install-prereqs.sh installs it).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
# shellcheck source=hack/lib/versions.sh
source "$here/lib/versions.sh"

STATE="${GPUSHARE_STATE_DIR:-/var/lib/gpushare-dev}"
SOCKET="${GPUSHARE_CONTAINERD_SOCKET:-$STATE/run/containerd.sock}"
CACHE="$GPUSHARE_CACHE_DIR/images"
STORE="$GPUSHARE_CACHE_DIR/buildah"
VENV_PY="$repo/.venv/bin/python"
# The chart's kube-scheduler image is the cluster's own release, which depends on its mode.
if [[ -f $STATE/mode ]]; then KUBE_VERSION=$(kube_version_for "$(cat "$STATE/mode")"); fi
KUBE_BIN="$GPUSHARE_CACHE_DIR/bin/kubernetes-$KUBE_VERSION"
SCHEDULER_IMAGE="registry.k8s.io/kube-scheduler:$KUBE_VERSION"

log() { printf '%s build-image: %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

what=all tag="" out="" do_import=1 force=0 format=docker-archive
while (($#)); do
  case $1 in
    gpushare | scheduler | all) what=$1 ;;
    --tag) tag=$2; shift ;;
    --out) out=$2; shift ;;
    --no-import) do_import=0 ;;
    --oci) format=oci-archive ;;
    --force) force=1 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
  shift
done

[[ $(id -u) -eq 0 ]] || die "needs root (buildah with chroot isolation, containerd import); rerun with sudo"
mkdir -p "$CACHE"

ctr_k8s() { ctr --address "$SOCKET" -n k8s.io "$@"; }

import_archive() { # ARCHIVE REF
  ((do_import)) || return 0
  if [[ ! -S $SOCKET ]]; then
    log "no containerd socket at $SOCKET; not importing (start the cluster: hack/local-cluster.sh up)"
    return 0
  fi
  ctr_k8s images import "$1" >/dev/null
  grep -qx "$(normalize "$2")" <<<"$(ctr_k8s images ls -q)" || die "import of $1 did not produce $2"
  log "imported $2 into containerd (k8s.io)"
}

normalize() { # REF -> the name containerd stores (docker.io/library/... for short names)
  local ref=$1 first=${1%%/*}
  if [[ $ref != */* ]]; then
    echo "docker.io/library/$ref"
  elif [[ $first == *.* || $first == *:* || $first == localhost ]]; then
    echo "$ref"
  else
    echo "docker.io/$ref"
  fi
}

have_image() { [[ -S $SOCKET ]] && grep -qx "$(normalize "$1")" <<<"$(ctr_k8s images ls -q)"; }

# ---------------------------------------------------------------------------------------------
build_scheduler() {
  local binary="$KUBE_BIN/kube-scheduler" archive="$CACHE/kube-scheduler-$KUBE_VERSION.tar"
  [[ -x $binary ]] || die "$binary missing; build it with hack/build-tools.sh kube"
  if ((force == 0)) && have_image "$SCHEDULER_IMAGE"; then
    log "$SCHEDULER_IMAGE already in containerd"
    return 0
  fi
  # Same layout as the official image: the binary in /usr/local/bin, run by `command:`.
  python3 "$here/lib/image_archive.py" --ref "$SCHEDULER_IMAGE" --out "$archive" \
    --add "$binary:/usr/local/bin/kube-scheduler" --entrypoint /usr/local/bin/kube-scheduler
  import_archive "$archive" "$SCHEDULER_IMAGE"
}

# ---------------------------------------------------------------------------------------------
build_gpushare() {
  command -v buildah >/dev/null || die "buildah not found; install it with hack/install-prereqs.sh (apt-get install buildah)"
  [[ -x $VENV_PY ]] || die "$VENV_PY missing; run make venv"
  local version base bases
  version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$repo/pyproject.toml" | head -1)
  tag=${tag:-gpushare/gpushare:$version}
  out=${out:-$CACHE/gpushare-$version.tar}
  # The base image is the Dockerfile's BASE_IMAGE (every stage is FROM it), pinned by digest
  # there; the stand-in takes its name without the digest (no local image can have the
  # registry's digest) and is passed as BASE_IMAGE.
  bases=$(awk 'toupper($1) == "FROM" {print $2}' "$repo/Dockerfile" | sort -u)
  [[ $bases == '${BASE_IMAGE}' ]] || die "the Dockerfile's stages are not all FROM \${BASE_IMAGE} ($bases)"
  base=$(sed -n 's/^ARG BASE_IMAGE=//p' "$repo/Dockerfile")
  [[ $base == *@sha256:* ]] || die "the Dockerfile's BASE_IMAGE is not pinned by digest ($base)"
  base=${base%@*}

  # Rebuild only when an input changed: the Dockerfile, the package, the wheelhouse's source.
  local stamp="$CACHE/gpushare.stamp" digest
  # The OCI revision label: the commit, marked -dirty when the work tree differs from it.
  local revision
  revision=$(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)
  [[ -z $(git -C "$repo" status --porcelain --untracked-files=no 2>/dev/null) ]] || revision+=-dirty
  digest=$(cd "$repo" && { cat Dockerfile .dockerignore pyproject.toml README.md LICENSE requirements.lock;
    echo "$revision";
    find gpushare -type f ! -name '*.pyc' ! -path '*/__pycache__/*' -print0 | sort -z | xargs -0 sha256sum;
    "$VENV_PY" -m pip freeze --all 2>/dev/null; echo "$base $tag"; } | sha256sum | cut -d' ' -f1)
  if ((force == 0)) && [[ $format == docker-archive && -f $stamp && $(cat "$stamp") == "$digest" && -f $out ]] && have_image "$tag"; then
    log "$tag is up to date (inputs unchanged since the last build)"
    return 0
  fi

  local bud=(buildah --root "$STORE/root" --runroot "$STORE/run" --storage-driver vfs)
  local prefix="${GPUSHARE_PYTHON_PREFIX:-$("$VENV_PY" -c 'import sys; print(sys.base_prefix)')}"
  local pyver base_archive
  pyver=$("$prefix/bin/python3" -c 'import platform; print(platform.python_version())')
  base_archive="$CACHE/python-base-$pyver-$(tr ':/' '__' <<<"$base").tar"
  if [[ ! -f $base_archive ]]; then
    log "assembling the stand-in for $base from this host (Python $pyver from $prefix)"
    python3 "$here/lib/python_base.py" --python "$prefix" --ref "$base" --out "$base_archive.tmp" \
      --work "$CACHE"
    mv "$base_archive.tmp" "$base_archive"
  fi
  if ! "${bud[@]}" inspect --type image "$base" >/dev/null 2>&1; then
    # Stored as localhost/NAME; the FROM line's short name resolves to it with --pull-never.
    "${bud[@]}" pull -q "docker-archive:$base_archive" >/dev/null
  fi

  local work
  work=$(mktemp -d "$CACHE/build.XXXXXX")
  trap 'rm -rf "$work"' RETURN
  log "packing the wheelhouse from .venv"
  "$VENV_PY" "$here/lib/wheelhouse.py" --out "$work/wheelhouse" --project "$repo/pyproject.toml" \
    --add setuptools 2>"$work/wheelhouse.log" || { cat "$work/wheelhouse.log" >&2; die "wheelhouse failed"; }
  printf '[global]\nno-index = true\nfind-links = /wheelhouse\ndisable-pip-version-check = true\n' >"$work/pip.conf"

  log "building $tag from the Dockerfile with buildah (no network)"
  local t0=$SECONDS
  # unshare --net: the build runs in an empty network namespace, so nothing can be fetched.
  unshare --net "${bud[@]}" bud --isolation chroot --pull-never --layers=false \
    -v "$work/wheelhouse:/wheelhouse:ro" -v "$work/pip.conf:/etc/pip.conf:ro" \
    --build-arg "VERSION=$version" --build-arg "REVISION=$revision" --build-arg "BASE_IMAGE=$base" \
    -f "$repo/Dockerfile" -t "$(normalize "$tag")" "$repo" >"$work/bud.log" 2>&1 ||
    { tail -40 "$work/bud.log" >&2; die "buildah bud failed (full log above)"; }
  rm -f "$out"
  "${bud[@]}" push -q "$(normalize "$tag")" "$format:$out:$(normalize "$tag")" >/dev/null
  # Keep the storage small: the base image stays, build containers and old images go.
  "${bud[@]}" rm --all >/dev/null 2>&1 || true
  "${bud[@]}" rmi --prune >/dev/null 2>&1 || true
  log "built $tag in $((SECONDS - t0))s -> $out ($(du -h "$out" | cut -f1))"
  import_archive "$out" "$tag"
  echo "$digest" >"$stamp"
}

case $what in
  gpushare) build_gpushare ;;
  scheduler) build_scheduler ;;
  all) build_gpushare; build_scheduler ;;
esac
