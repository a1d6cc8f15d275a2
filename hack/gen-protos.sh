#!/usr/bin/env bash
# Generate the Python stubs (+ .pyi) of the kubelet gRPC APIs gpushare speaks, from the .proto
# files kept in the repo. Usage: hack/gen-protos.sh [OUT_DIR]   (default: the repo root)
# Protos are compiled with the repo root as include path, so their descriptor names are unique
# ("gpushare/node/deviceplugin/v1beta1/api.proto") and both api.proto files load in one process.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${1:-$root}
python=${PYTHON:-$root/.venv/bin/python}
# The .pyi stubs come from mypy-protobuf's plugins (pinned dev dependency): protoc's own
# --pyi_out stubs use bare generics that mypy --strict rejects, and it writes none for *_pb2_grpc.
bin=$(dirname "$python")
protos=(
  gpushare/node/deviceplugin/v1beta1/api.proto
  gpushare/node/core/podresources/v1/api.proto
  gpushare/node/dra/v1/api.proto
  gpushare/node/dra/v1beta1/api.proto
  gpushare/node/dra/pluginregistration/v1/api.proto
)
mkdir -p "$out"
cd "$root"
"$python" -m grpc_tools.protoc -I . \
  --plugin=protoc-gen-mypy="$bin/protoc-gen-mypy" \
  --plugin=protoc-gen-mypy_grpc="$bin/protoc-gen-mypy_grpc" \
  --python_out="$out" --grpc_python_out="$out" --mypy_out="$out" --mypy_grpc_out="$out" \
  "${protos[@]}"
