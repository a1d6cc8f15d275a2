#!/usr/bin/env bash
# Install the OS packages the local cluster harness needs, from the distribution's archive
# (Debian 12, Ubuntu 24.04). Idempotent: installs only what is missing. Needs root (or sudo).
#
#   hack/install-prereqs.sh [demo|all]   (default: all)
# demo: what `make demo` runs (containerd, runc, CNI plugins, busybox, iptables, buildah, ...);
# all: also Prometheus, which the exporter's tests scrape with.
# Either way, golang-go when there is no Go at all: the distribution's Go is usually older than
# the tools need, and hack/build-tools.sh uses it only to fetch a newer one (hack/lib/go.sh).
set -euo pipefail
what=${1:-all}
# python3-venv: `make venv` (Debian's python3 has no venv module without it); ca-certificates:
# Go and pip download over HTTPS; bsdextrautils: `column`, for `make help`.
pkgs=(containerd runc containernetworking-plugins busybox-static iptables conntrack socat
      iproute2 openssl buildah python3-venv ca-certificates bsdextrautils)
case $what in
  demo) ;;
  all) pkgs+=(prometheus) ;;
  -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  *) echo "install-prereqs: unknown set '$what'; use demo or all" >&2; exit 2 ;;
esac
command -v go >/dev/null || pkgs+=(golang-go)
missing=()
for p in "${pkgs[@]}"; do
  grep -q 'install ok installed' <<<"$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "install-prereqs: all present (${pkgs[*]})"
  exit 0
fi
sudo=""
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "install-prereqs: run as root: apt-get install -y ${missing[*]}" >&2; exit 1; }
  sudo=sudo
fi
echo "install-prereqs: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
