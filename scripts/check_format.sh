#!/usr/bin/env bash
# Checks that every C++ and CUDA source follows .clang-format (installs
# Debian's clang-format when missing). With --fix, formats them in place.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
if ! command -v clang-format >/dev/null; then
  echo "check_format: installing clang-format" >&2
  sudo_cmd=()
  [ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends clang-format >/dev/null
fi
# Tracked and new files (not ignored ones), as they are in the working tree.
mapfile -t files < <(git ls-files --cached --others --exclude-standard 'src/*.h' 'src/*.cc' \
  'src/*.cu' 'src/*.cuh' 'tests/*.h' 'tests/*.cc' 'bench/*.h' 'bench/*.cc' 'bench/*.cu' \
  'bench/*.cuh' 'fuzz/*.h' 'fuzz/*.cc' |
  while read -r f; do [ -f "$f" ] && echo "$f"; done)
if [ "${1:-}" = "--fix" ]; then
  clang-format -i "${files[@]}"
  exit 0
fi
if ! clang-format --dry-run --Werror "${files[@]}" 2>/tmp/ncf-format.$$; then
  { grep -E '^[^ ].*: (error|warning):' /tmp/ncf-format.$$ || cat /tmp/ncf-format.$$; } |
    cut -d: -f1 | sort -u | sed 's/^/check_format: not formatted: /' >&2
  rm -f /tmp/ncf-format.$$
  echo "check_format: run 'bash scripts/check_format.sh --fix'" >&2
  exit 1
fi
rm -f /tmp/ncf-format.$$
echo "check_format: ${#files[@]} files follow .clang-format"
