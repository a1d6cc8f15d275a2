#!/usr/bin/env bash
# Install the OS packages the local cluster harness needs, from Debian's archive.
# Idempotent: installs only what is missing. Needs root (or sudo).
set -euo pipefail
pkgs=(containerd runc containernetworking-plugins busybox-static iptables conntrack socat
      iproute2 openssl prometheus buildah)
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
