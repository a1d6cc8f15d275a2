# One image for every gpushare component; the chart picks the entry point per workload:
#   gpushare-controller   scheduler extender + admission webhook + GpuShare operator (Deployment)
#   gpushare-node-agent   device plugin + MPS manager + exporter (DaemonSet)
#   kubectl-gpushare      the kubectl plugin, handy inside the cluster for debugging
#
#   docker build --build-arg VERSION=0.1.0 --build-arg REVISION=$(git rev-parse HEAD) \
#     -t <registry>/gpushare:0.1.0 .
#
# Every dependency is installed at the version requirements.lock pins (`make lock`).
# VERSION must equal the package's version (the build refuses another), so the image's
# org.opencontainers.image.version label cannot lie; REVISION is the source commit.
# hack/build-image.sh builds this same file offline with buildah (see docs/chart.md).

# The base, pinned by digest: the OCI index (every platform) of python:3.11-slim-bookworm,
# CPython 3.11.16 on Debian 12, as published in September 2026. A rebuild gets exactly these
# bytes; bump it deliberately, with the digest `docker buildx imagetools inspect
# python:3.11-slim-bookworm` prints. hack/build-image.sh passes a local stand-in instead.
ARG BASE_IMAGE=python:3.11-slim-bookworm@sha256:a36c24f9cbdf4fd0f52d67f0823eeac19c2028c637cecc392d97f980d4fec56b

FROM ${BASE_IMAGE} AS build
WORKDIR /src
COPY requirements.lock pyproject.toml README.md LICENSE ./
# The build backend at its locked version; setuptools builds wheels by itself, so no build
# isolation (and no "wheel") is needed.
RUN pip install --no-cache-dir --root-user-action=ignore -c requirements.lock setuptools
COPY gpushare ./gpushare
RUN pip wheel --no-cache-dir --no-build-isolation -c requirements.lock --wheel-dir /wheels .

FROM ${BASE_IMAGE}
ARG VERSION=""
ARG REVISION=""
LABEL org.opencontainers.image.title="gpushare" \
      org.opencontainers.image.description="Pack several Kubernetes pods onto one NVIDIA GPU with MPS" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/kube-gpushare/kube-gpushare" \
      org.opencontainers.image.documentation="https://github.com/kube-gpushare/kube-gpushare/tree/main/docs" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"
# The final stage installs only what the build stage resolved: no index, no compilers.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    --mount=type=bind,from=build,source=/src/requirements.lock,target=/tmp/requirements.lock \
    pip install --no-cache-dir --root-user-action=ignore --no-index --find-links /wheels \
      -c /tmp/requirements.lock kube-gpushare \
    && pip check \
    && installed="$(python -c 'from importlib.metadata import version; print(version("kube-gpushare"))')" \
    && { [ "$VERSION" = "$installed" ] || { echo "build-arg VERSION='$VERSION' but the package is $installed: pass --build-arg VERSION=$installed" >&2; exit 1; }; } \
    && gpushare-controller --help >/dev/null && gpushare-node-agent --help >/dev/null
ENV PYTHONUNBUFFERED=1
# Non-root by default (the controller); the node agent's DaemonSet runs as root because it
# serves sockets in the kubelet's root-owned directories and starts the MPS daemons.
USER 65532:65532
CMD ["gpushare-controller", "--help"]
