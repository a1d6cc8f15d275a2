# One image for every gpushare component; the chart picks the entry point per workload:
#   gpushare-controller   scheduler extender + admission webhook + GpuShare operator (Deployment)
#   gpushare-node-agent   device plugin + MPS manager + exporter (DaemonSet)
#   kubectl-gpushare      the kubectl plugin, handy inside the cluster for debugging
#
#   docker build -t <registry>/gpushare:<version> .
#
# hack/build-image.sh builds this same file offline with buildah (see docs/chart.md).

FROM python:3.11-slim-bookworm AS build
WORKDIR /src
# setuptools >= 70.1 builds wheels by itself, so no build isolation (and no "wheel") is needed.
RUN pip install --no-cache-dir --root-user-action=ignore "setuptools>=70.1"
COPY pyproject.toml README.md ./
COPY gpushare ./gpushare
RUN pip wheel --no-cache-dir --no-build-isolation --wheel-dir /wheels .

FROM python:3.11-slim-bookworm
LABEL org.opencontainers.image.title="gpushare" \
      org.opencontainers.image.description="Pack several Kubernetes pods onto one NVIDIA GPU with MPS" \
      org.opencontainers.image.licenses="Apache-2.0"
# The final stage installs only what the build stage resolved: no index, no compilers.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir --root-user-action=ignore --no-index --find-links /wheels gpushare \
    && pip check \
    && gpushare-controller --help >/dev/null && gpushare-node-agent --help >/dev/null
ENV PYTHONUNBUFFERED=1
# Non-root by default (the controller); the node agent's DaemonSet runs as root because it
# serves sockets in the kubelet's root-owned directories and starts the MPS daemons.
USER 65532:65532
CMD ["gpushare-controller", "--help"]
