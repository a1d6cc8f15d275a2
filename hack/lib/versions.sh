# Versions of the components the local cluster harness builds. Sourced by hack/*.sh.
# Bump a version here and the cache key changes, so the next `up` rebuilds it.
KUBE_VERSION="${KUBE_VERSION:-v1.34.4}"
# The DRA mode's Kubernetes (hack/local-cluster.sh in dra mode, the scale bench's --dra phase).
# v1.34.4's allocator uses only a node's first device once that device is shared
# (kubernetes/kubernetes#133705, fixed in v1.35 by #133706): measured in bench/results/dra.md.
# The device-plugin mode keeps KUBE_VERSION, the release users run.
DRA_KUBE_VERSION="${DRA_KUBE_VERSION:-v1.35.4}"
# kube_version_for MODE: the Kubernetes release a cluster of that mode runs.
kube_version_for() { if [[ $1 == dra ]]; then echo "$DRA_KUBE_VERSION"; else echo "$KUBE_VERSION"; fi; }
# Staging modules (k8s.io/api, k8s.io/client-go, ...) are published as v0.<minor>.<patch>.
KUBE_STAGING_VERSION="v0${KUBE_VERSION#v1}"
ETCD_VERSION="${ETCD_VERSION:-v3.5.35}"
HELM_VERSION="${HELM_VERSION:-v3.21.4}"
KWOK_VERSION="${KWOK_VERSION:-v0.7.0}"
# containerd for the DRA mode of the local cluster (CDI needs >= 1.7; the default mode keeps the
# distribution's containerd). v2.2 speaks the CRI of Kubernetes 1.34 (k8s.io/cri-api v0.34).
CONTAINERD_VERSION="${CONTAINERD_VERSION:-v2.2.9}"
# The Prometheus Operator (and its CRDs) for the kube-prometheus-stack-style monitoring test.
PROMETHEUS_OPERATOR_VERSION="${PROMETHEUS_OPERATOR_VERSION:-v0.85.0}"
# Prometheus v3.5.0, published on the module proxy as github.com/prometheus/prometheus v0.305.0.
PROMETHEUS_VERSION="${PROMETHEUS_VERSION:-v3.5.0}"
PROMETHEUS_MODULE_VERSION="${PROMETHEUS_MODULE_VERSION:-v0.305.0}"
# Kueue (its manager, CRDs and webhook manifests) for the queueing test (docs/queues.md). v0.17
# is built on the Kubernetes v0.35 libraries, within client-go's one-minor skew of KUBE_VERSION.
KUEUE_VERSION="${KUEUE_VERSION:-v0.17.0}"
# Go: the oldest release that builds every tool above (etcd's and helm's go.mod ask for 1.26),
# and the release hack/lib/go.sh fetches when the Go on PATH is older.
GO_MIN_VERSION=1.26.0
GO_VERSION="${GO_VERSION:-1.26.8}"
GPUSHARE_CACHE_DIR="${GPUSHARE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/gpushare}"
