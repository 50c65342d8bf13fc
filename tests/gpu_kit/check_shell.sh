#!/usr/bin/env bash
# The GPU kit's shell files (scripts/gpu_kit.sh and the stage files it sources,
# scripts/gpu_kit/*.sh). Argument syntax: bash -n on each. Argument shellcheck: ShellCheck
# on all of them (-x: the entry point's sources followed), or "skipped: no shellcheck" where
# it is not installed (scripts/run_tests.sh installs it).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
files=(scripts/gpu_kit.sh scripts/gpu_kit/*.sh)
case "${1:-}" in
  syntax)
    for f in "${files[@]}"; do bash -n "$f"; done
    echo "gpu_kit shell: bash -n clean on ${#files[@]} files"
    ;;
  shellcheck)
    if ! command -v shellcheck >/dev/null 2>&1; then
      echo "gpu_kit shell: skipped: no shellcheck"
      exit 0
    fi
    shellcheck -x "${files[@]}"
    echo "gpu_kit shell: shellcheck clean on ${#files[@]} files"
    ;;
  *) echo "usage: check_shell.sh syntax|shellcheck" >&2; exit 2 ;;
esac
