#!/usr/bin/env bash
# Builds the fuzz targets (fuzz/, libFuzzer + ASan + UBSan) into build-fuzz/
# with Debian's clang, installing what is missing first: the libraries of
# scripts/setup.sh and clang, its libFuzzer and sanitizer runtimes
# (libclang-rt-14-dev), lld (the targets' linker) and llvm (llvm-symbolizer,
# for readable stack traces).
# NCF_FUZZ_BUILD_DIR overrides the directory. Used by bench/fuzz.sh and
# scripts/fuzz_replay.sh.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${NCF_FUZZ_BUILD_DIR:-$root/build-fuzz}"
bash "$root/scripts/setup.sh"
missing=()
for p in clang libclang-rt-14-dev lld llvm; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "fuzz_build: installing ${missing[*]}" >&2
  sudo_cmd=()
  [ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
cmake -S "$root/fuzz" -B "$build" -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  >"$build.configure.log" 2>&1 || { cat "$build.configure.log"; exit 1; }
cmake --build "$build" -j "$(nproc)" 2>&1 | grep -E "error|warning|Error" || true
cmake --build "$build" -j "$(nproc)" >/dev/null
