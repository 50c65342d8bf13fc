#!/usr/bin/env bash
# Installs ONNX Runtime for Node (onnxruntime-node, the version package.json
# pins) into DIR/node_modules, once: the export test runs exported models with
# it. Only the CPU build: ONNXRUNTIME_NODE_INSTALL_CUDA=skip keeps its install
# script from fetching the GPU libraries.
#   bash tests/onnx/install.sh DIR
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
dir="${1:?usage: install.sh DIR}"
want=$(sed -n 's/.*"onnxruntime-node": "\(.*\)".*/\1/p' "$here/package.json")
have=$(sed -n 's/^  "version": "\(.*\)",$/\1/p' "$dir/node_modules/onnxruntime-node/package.json" 2>/dev/null || true)
[ "$have" = "$want" ] && exit 0
command -v npm >/dev/null || { echo "install.sh: npm is missing (scripts/setup.sh installs it)" >&2; exit 1; }
mkdir -p "$dir"
cp "$here/package.json" "$dir/package.json"
cd "$dir"
ONNXRUNTIME_NODE_INSTALL_CUDA=skip npm install --no-audit --no-fund --loglevel=error >&2
