#!/usr/bin/env bash
# `make release`: every artefact a release publishes, built on this machine into
# dist/release-v<version>/, with their SHA-256 sums (docs/development.md, "Releasing"):
#
#   gpushare-v<version>.oci.tar              the image, from the Dockerfile (hack/build-image.sh
#                                            --oci: buildah, no network), an OCI archive to push
#                                            with `skopeo copy oci-archive:... docker://...`
#   gpushare-v<version>.spdx.json            the image's SBOM (SPDX 2.3: its Debian packages and
#                                            Python distributions, hack/sbom.py)
#   gpushare-<version>.tgz                   the Helm chart (helm package, made reproducible by
#                                            hack/chart_package.py: same sources, same bytes)
#   kube_gpushare-<version>-py3-none-any.whl the whole package (pip wheel)
#   kubectl_gpushare-<version>-py3-none-any.whl  the CLI alone (hack/cli_wheel.py)
#   kubectl-gpushare_v<version>.zip          the krew plugin archive (hack/krew.py; the
#                                            committed deploy/krew/gpushare.yaml must match it)
#   gpushare.io_gpushares.yaml               the CRD (also inside the chart)
#   SHA256SUMS                               sha256sum of every file above
#
# Refuses a work tree with uncommitted changes (the image's revision label would say -dirty),
# unless RELEASE_ALLOW_DIRTY=1. Needs root, buildah and helm (make tools builds helm).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
cd "$repo"
die() { echo "release: $*" >&2; exit 1; }
log() { echo "release: $*" >&2; }

version=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml | head -1)
[[ $(python3 -c 'import gpushare; print(gpushare.__version__)') == "$version" ]] ||
  die "gpushare/__init__.py and pyproject.toml name different versions"
if [[ -n $(git status --porcelain --untracked-files=no) && ${RELEASE_ALLOW_DIRTY:-0} != 1 ]]; then
  die "the work tree has uncommitted changes; commit them (or RELEASE_ALLOW_DIRTY=1)"
fi
helm=$(eval "$(hack/local-cluster.sh env)"; command -v helm) || die "helm not found (make tools)"
py=.venv/bin/python
[[ -x $py ]] || die ".venv missing; run make venv"

out="$repo/dist/release-v$version"
rm -rf "$out"; mkdir -p "$out"

log "image -> gpushare-v$version.oci.tar"
hack/build-image.sh gpushare --oci --no-import --force --tag "gpushare/gpushare:$version" \
  --out "$out/gpushare-v$version.oci.tar"
log "image SBOM -> gpushare-v$version.spdx.json"
"$py" hack/sbom.py --image "$out/gpushare-v$version.oci.tar" --version "$version" \
  --out "$out/gpushare-v$version.spdx.json" >/dev/null
log "chart"
"$py" hack/chart_package.py --helm "$helm" --out "$out" >/dev/null
log "wheels"
"$py" -m pip wheel --quiet --no-deps --no-build-isolation --wheel-dir "$out" .
"$py" hack/cli_wheel.py --out "$out" >/dev/null
log "krew archive"
"$py" hack/krew.py --dist "$out" --manifest "$out/gpushare.krew.yaml" >/dev/null
cmp -s "$out/gpushare.krew.yaml" deploy/krew/gpushare.yaml ||
  die "deploy/krew/gpushare.yaml is stale: run make krew and commit it"
rm "$out/gpushare.krew.yaml"
cp crds/*.yaml "$out/"
(cd "$out" && sha256sum -- * >SHA256SUMS)
log "done: $out"
ls -l "$out" >&2
