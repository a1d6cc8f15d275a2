#!/usr/bin/env bash
# Run the scale bench (or the openb replay) on a bare machine that has python3 and nothing of
# this project's
# toolchain: no Go, no cached Kubernetes binaries, no project virtualenv, possibly no openssl,
# curl or kubectl, and no network. Everything comes from a "pack" directory made on a
# development machine (see docs/scale.md, "On another machine"):
#
#   PACK/*.tar.xz   tar archives holding kube-apiserver, kube-scheduler, etcd and kwok (one
#                   or several parts; each is unpacked into BIN_DIR and kept there)
#   PACK/pki/       a CA, certificates and keys from `hack/kwok-cluster.sh pki DIR`
#   PACK/traces/    the openb lists the bench reads (openb_pod_list_default.csv; the replay
#                   also needs openb_node_list_gpu_node.csv and each pod list it replays)
#   WHEELS/*.whl    (optional) wheels of the Python packages the bench and controller import,
#                   installed with pip --target when python3 cannot import them
#
#   bench/scale/bare-machine.sh [--unpack-only] PACK OUT [WHEELS] [-- bench args...]
#
# --unpack-only unpacks the archives and stops (a first call when the parts do not travel
# together). Results go to OUT: scale.json, scale.md (or openb-replay.*), bench.log,
# machine.txt, logs.tgz. Settings: BENCH (scale, the default, or replay: bench.BENCH.run),
# BIN_DIR (default /tmp/gpushare-scale-bin), SITE_DIR (default /tmp/gpushare-scale-site),
# PYTHON (default python3).
set -euo pipefail
unpack_only=0
if [[ ${1:-} == --unpack-only ]]; then unpack_only=1; shift; fi
[[ $# -ge 2 ]] || { sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
pack=$(cd "$1" && pwd)
out=$2
shift 2
wheels=""
if [[ $# -gt 0 && $1 != -- ]]; then wheels=$(cd "$1" && pwd); shift; fi
[[ ${1:-} == -- ]] && shift
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BIN_DIR=${BIN_DIR:-/tmp/gpushare-scale-bin}
SITE_DIR=${SITE_DIR:-/tmp/gpushare-scale-site}
PYTHON=${PYTHON:-python3}
BENCH=${BENCH:-scale}
case $BENCH in
  scale) result=scale ;;
  replay) result=openb-replay ;;
  *) echo "bare-machine: BENCH must be scale or replay, not '$BENCH'" >&2; exit 2 ;;
esac
NEEDED=(kube-apiserver kube-scheduler etcd kwok)
mkdir -p "$out" "$BIN_DIR"
say() { printf '%s bare-machine: %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }

shopt -s nullglob
archives=("$pack"/*.tar.xz)
t0=$SECONDS
for a in "${archives[@]}"; do
  # python's lzma, not xz(1): the one decompressor every machine with python3 has.
  "$PYTHON" -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter="data")' \
    "$a" "$BIN_DIR"
  say "unpacked $(basename "$a") into $BIN_DIR"
done
((${#archives[@]} == 0)) || say "unpacking took $((SECONDS - t0))s"
missing=()
for b in "${NEEDED[@]}"; do [[ -x $BIN_DIR/$b ]] || missing+=("$b"); done
if ((${#missing[@]})); then
  say "error: $BIN_DIR lacks ${missing[*]}: unpack the part holding them first (a call with" \
    "--unpack-only and that part; files outside the repo last only while the machine is kept)"
  exit 3
fi
((unpack_only)) && { say "unpack only: done"; ls -la "$BIN_DIR" >&2; exit 0; }

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "nproc: $(nproc) (online CPUs $(getconf _NPROCESSORS_ONLN))"
  grep -m1 '^model name' /proc/cpuinfo || true
  grep -m1 '^MemTotal' /proc/meminfo || true
  echo "kernel: $(uname -r); /proc/version: $(cat /proc/version 2>/dev/null || true)"
  echo "cgroup cpu.max: $(cat /sys/fs/cgroup/cpu.max 2>/dev/null || echo none)"
  echo "loadavg: $(cat /proc/loadavg 2>/dev/null || true)"
  for t in openssl curl kubectl xz; do echo "$t: $(command -v "$t" || echo absent)"; done
  echo "python: $("$PYTHON" -V 2>&1) at $(command -v "$PYTHON")"
  df -h /tmp /var/lib 2>/dev/null || true
} >"$out/machine.txt"
cat "$out/machine.txt" >&2

imports="import aiohttp, msgspec, lightkube, cryptography, yaml, prometheus_client, kopf"
if ! "$PYTHON" -c "$imports" 2>/dev/null; then
  [[ -n $wheels ]] || { say "error: $PYTHON cannot import the bench's packages and no WHEELS dir was given"; exit 3; }
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE_DIR" "$wheels"/*.whl
  export PYTHONPATH="$SITE_DIR${PYTHONPATH:+:$PYTHONPATH}"
  "$PYTHON" -c "$imports"
  say "installed $(ls "$wheels"/*.whl | wc -l) wheels into $SITE_DIR"
fi

export GPUSHARE_SCALE_BIN_DIR=$BIN_DIR PYTHONUNBUFFERED=1
[[ -d $pack/pki ]] && export GPUSHARE_SCALE_PKI_DIR=$pack/pki
traces=()
[[ -d $pack/traces ]] && traces=(--traces "$pack/traces")
logs=$(mktemp -d)
rc=0
cd "$repo"
"$PYTHON" -m "bench.$BENCH.run" "${traces[@]}" --out "$out/$result" --logs "$logs" "$@" \
  2>&1 | tee "$out/bench.log" || rc=$?
tar -C "$logs" -czf "$out/logs.tgz" . || true
rm -rf "$logs"
say "bench exited $rc"
exit "$rc"
