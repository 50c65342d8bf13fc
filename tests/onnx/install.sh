#!/usr/bin/env bash
# Installs ONNX Runtime for Node (onnxruntime-node, the version package.json
# pins) into DIR/node_modules, once: the export tests run exported models with
# it. Only the CPU build: ONNXRUNTIME_NODE_INSTALL_CUDA=skip keeps its install
# script from fetching the GPU libraries. Tests running side by side call this
# at the same time, so the check and the install happen under one lock on
# DIR.lock: the first caller installs, the others wait and find it done.
#   bash tests/onnx/install.sh DIR
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
dir="${1:?usage: install.sh DIR}"
want=$(sed -n 's/.*"onnxruntime-node": "\(.*\)".*/\1/p' "$here/package.json")
installed() {
  local have
  have=$(sed -n 's/^  "version": "\(.*\)",$/\1/p' "$dir/node_modules/onnxruntime-node/package.json" 2>/dev/null || true)
  [ "$have" = "$want" ] && [ -f "$dir/.installed" ]
}
installed && exit 0
command -v npm >/dev/null || { echo "install.sh: npm is missing (scripts/setup.sh installs it)" >&2; exit 1; }
command -v flock >/dev/null || { echo "install.sh: flock is missing (util-linux)" >&2; exit 1; }
mkdir -p "$dir"
exec 9>"$dir.lock"
flock 9
installed && exit 0
rm -f "$dir/.installed"
cp "$here/package.json" "$dir/package.json"
cd "$dir"
ONNXRUNTIME_NODE_INSTALL_CUDA=skip npm install --no-audit --no-fund --loglevel=error >&2
touch .installed
