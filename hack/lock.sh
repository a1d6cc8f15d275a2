#!/usr/bin/env bash
# requirements.lock: the exact version of every runtime and dev dependency, for every platform
# and Python >= 3.11, resolved by uv from pyproject.toml. `make venv`, CI and the image's
# build (Dockerfile) install with it as pip constraints.
#
#   hack/lock.sh write     re-resolve after a dependency change; pins that still fit are kept
#   hack/lock.sh upgrade   re-resolve at the newest versions pyproject.toml allows
#   hack/lock.sh verify    fail (showing the diff) when `write` would change the lock
#   hack/lock.sh lowest    install every direct dependency at its lower bound in a scratch
#                          venv and run the unit and chart tests there: the lower bounds in
#                          pyproject.toml are claims, this checks them
#
# uv comes from the package index at the version the lock itself pins (it is a dev
# dependency), installed into .venv when missing.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
cd "$repo"
LOCK=requirements.lock
VENV=${VENV:-.venv}

die() { echo "lock: $*" >&2; exit 1; }
[[ -x $VENV/bin/python ]] || die "$VENV/bin/python missing; run: python3 -m venv $VENV"

uv_pin=$(sed -n 's/^uv==\([^ ;]*\).*/\1/p' "$LOCK" 2>/dev/null | head -1)
uv_pin=${uv_pin:-$(sed -n 's/.*"uv==\([^"]*\)".*/\1/p' pyproject.toml | head -1)}
[[ -n $uv_pin ]] || die "no uv version pinned in $LOCK or pyproject.toml"
if [[ $("$VENV/bin/uv" --version 2>/dev/null | cut -d' ' -f2) != "$uv_pin" ]]; then
  "$VENV/bin/pip" install -q "uv==$uv_pin"
fi
uv="$VENV/bin/uv"

# The one resolution command; its header in the lock says how to rerun it.
compile() { # OUTPUT [uv options...]
  local out=$1; shift
  "$uv" pip compile pyproject.toml --extra dev --universal --python-version 3.11 --quiet \
    --custom-compile-command 'make lock' -o "$out" "$@"
}

case ${1:-} in
  write) compile "$LOCK" ;;
  upgrade) compile "$LOCK" --upgrade ;;
  verify)
    tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
    cp "$LOCK" "$tmp/lock"
    compile "$tmp/lock"
    if ! diff -u "$LOCK" "$tmp/lock"; then
      die "$LOCK is stale: pyproject.toml's dependencies changed; run \`make lock\` and commit it"
    fi
    echo "lock: $LOCK is current"
    ;;
  lowest)
    tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
    "$uv" pip compile pyproject.toml --extra dev --python-version 3.11 --quiet \
      --resolution lowest-direct -o "$tmp/lowest.txt"
    echo "lock: direct dependencies at their lower bounds:"
    python3 - "$tmp/lowest.txt" <<'EOF'
import re, sys, tomllib
names = {re.split(r"[<>=!~ \[;]", d, maxsplit=1)[0].lower().replace("_", "-")
         for d in tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]}
for line in open(sys.argv[1]):
    pin = line.split(";")[0].strip()
    if "==" in pin and pin.split("==")[0].lower() in names:
        print("  " + pin)
EOF
    "$uv" venv -q --python "$(command -v python3.11 || command -v python3)" "$tmp/venv"
    "$uv" pip install -q --python "$tmp/venv/bin/python" -r "$tmp/lowest.txt"
    "$uv" pip install -q --python "$tmp/venv/bin/python" --no-deps -e .
    # Not about bounds: the proto check regenerates stubs with .venv's grpcio-tools, and this
    # venv is by design not the lock's.
    "$tmp/venv/bin/python" -m pytest -q -p no:cacheprovider -m 'not cluster and not gpu' \
      tests/unit tests/chart \
      --deselect tests/unit/node/deviceplugin/test_deviceplugin_protos.py::test_regenerating_the_stubs_changes_nothing \
      --deselect tests/unit/project/test_packaging.py::test_this_environment_was_installed_from_the_lock
    ;;
  *) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
