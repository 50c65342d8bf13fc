#!/usr/bin/env bash
# Installs what is missing, configures and builds ncf_dist into ./build.
# NCF_BUILD_DIR, NCF_CUDA (AUTO|ON|OFF), NCF_CUDA_ARCHITECTURES and NCF_WERROR (ON|OFF)
# override defaults.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh"
build="${NCF_BUILD_DIR:-$root/build}"
werror="${NCF_WERROR:-OFF}"
# CUDA architectures: NCF_CUDA_ARCHITECTURES (a CMake list such as "80;90"), else the
# project's default, sm_80 and sm_90; CI compiles the CUDA code once, for sm_90 (the GPU
# machines' H100/H200), which halves the CUDA part of its build.
archs="${NCF_CUDA_ARCHITECTURES:-}"
if [ "${CI:-}" = "true" ]; then
  werror=ON
  archs="${archs:-90}"
fi
arch_flag=()
[ -n "$archs" ] && arch_flag=(-DCMAKE_CUDA_ARCHITECTURES="$archs")
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DNCF_CUDA="${NCF_CUDA:-AUTO}" \
  -DNCF_WERROR="$werror" "${arch_flag[@]}" >"$build.configure.log" 2>&1 ||
  { cat "$build.configure.log"; exit 1; }
cmake --build "$build" -j "$(nproc)" 2>&1 | grep -E "error|warning|Error" || true
cmake --build "$build" -j "$(nproc)" >/dev/null
