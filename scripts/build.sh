#!/usr/bin/env bash
# Installs what is missing, configures and builds ncf_dist into ./build.
# NCF_BUILD_DIR, NCF_CUDA (AUTO|ON|OFF) and NCF_WERROR (ON|OFF) override defaults.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh"
build="${NCF_BUILD_DIR:-$root/build}"
werror="${NCF_WERROR:-OFF}"
[ "${CI:-}" = "true" ] && werror=ON
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DNCF_CUDA="${NCF_CUDA:-AUTO}" \
  -DNCF_WERROR="$werror" >"$build.configure.log" 2>&1 || { cat "$build.configure.log"; exit 1; }
cmake --build "$build" -j "$(nproc)" 2>&1 | grep -E "error|warning|Error" || true
cmake --build "$build" -j "$(nproc)" >/dev/null
