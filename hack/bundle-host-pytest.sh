#!/usr/bin/env bash
# Run cluster tests on another machine from the bundle of hack/gpu-host-bundle.sh: a machine
# with more cores than the development VM, no container runtime, no Kubernetes and no network.
# For measurements the VM's two cores distort (the flood test of issue 67: the attacker and the
# controller share them), not for the suite: `make test` is the suite.
#
#   hack/bundle-host-pytest.sh --bundle DIR [--mode deviceplugin|dra] [--wheels DIR] -- PYTEST_ARGS
#
#   --bundle DIR   the gpu-host-bundle.tar.xz.part-* files and SHA256SUMS (unpacked once into
#                  /var/tmp/gpushare-gpu-host, or GPUSHARE_GPU_HOST_WORK, as gpu-host-e2e.sh does)
#   --mode M       the local cluster's mode (default deviceplugin); the bundle must match it
#   --wheels DIR   wheels of the project's dependencies and pytest's for this machine's Python
#                  (pip download --only-binary=:all: --python-version X.Y ...; docs/gpu-cluster.md):
#                  installed into a virtual environment in the work directory over the
#                  machine's Python, never into the machine's Python itself
#
# The tests bring the local cluster up from the carried binaries (tests/fixtures/cluster.py
# runs hack/local-cluster.sh) and the controller and node agent as processes of this Python;
# the cluster is taken down afterwards unless it was up before. Needs root, python3, xz.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"

log() { printf '%s bundle-host-pytest: %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }
# shellcheck source=hack/lib/bundle.sh
source "$here/lib/bundle.sh"

bundle="" mode=deviceplugin wheels=""
while (($#)); do
  case $1 in
    --bundle) bundle=$2; shift ;;
    --mode) mode=$2; shift ;;
    --wheels) wheels=$2; shift ;;
    --) shift; break ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (see --help; pytest's arguments go after --)" ;;
  esac
  shift
done
[[ -n $bundle ]] || die "--bundle DIR is required (the parts written by hack/gpu-host-bundle.sh)"
[[ $(id -u) -eq 0 ]] || die "needs root (containerd and the kubelet run here)"
[[ $mode == deviceplugin || $mode == dra ]] || die "--mode must be deviceplugin or dra, got '$mode'"
(($#)) || die "no tests named: give pytest's arguments after -- (e.g. -- tests/faults/test_flood_cluster.py)"

work=${GPUSHARE_GPU_HOST_WORK:-/var/tmp/gpushare-gpu-host}
B=$(bundle_unpack "$bundle" "$work")
bundle_env "$B" "$mode"

PYTHON=${GPUSHARE_HOST_PYTHON:-$(command -v python3 || die "python3 not found")}
if [[ -n $wheels ]]; then
  # A virtual environment over the machine's Python: its site-packages come before the
  # machine's (an older grpcio there would otherwise win), and the controller and node agent
  # the tests start (sys.executable) run in it too.
  venv=$work/venv
  log "installing the wheels of $wheels into $venv"
  rm -rf "$venv"
  "$PYTHON" -m venv --without-pip --system-site-packages "$venv" || die "$PYTHON -m venv failed"
  site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "$wheels"/*.whl ||
    die "pip could not install the wheels of $wheels for $("$PYTHON" -V 2>&1)"
  PYTHON=$venv/bin/python
fi

was_up=0
bash "$here/local-cluster.sh" status >/dev/null 2>&1 && was_up=1
cd "$repo"
rc=0
PYTHONPATH=$repo "$PYTHON" -m pytest -p no:cacheprovider "$@" || rc=$?
if ((was_up == 0)); then
  log "taking the cluster down"
  bash "$here/local-cluster.sh" down >/dev/null 2>&1 || true
fi
exit $rc
