#!/usr/bin/env bash
# Fail when the committed protobuf/gRPC stubs differ from what hack/gen-protos.sh produces now.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$root/hack/gen-protos.sh" "$tmp"
status=0
while IFS= read -r generated; do
  rel=${generated#"$tmp"/}
  if ! diff -u "$root/$rel" "$generated"; then
    echo "verify-protos: $rel is stale; run hack/gen-protos.sh and commit the result" >&2
    status=1
  fi
done < <(find "$tmp" -type f -name '*_pb2*' | sort)
exit $status
