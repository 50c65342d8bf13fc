#!/usr/bin/env bash
# Quick start #2: set up, build, and run the whole test suite (CPU tests; GPU
# tests run when a GPU is present and are listed as skipped otherwise).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/build.sh"
build="${NCF_BUILD_DIR:-$root/build}"
cd "$build"
ctest --output-on-failure -j "$(nproc)" --timeout 900 "$@"
