#!/usr/bin/env bash
# CI's fuzzing step (scripts/run_tests.sh runs it beside the tests): builds the fuzz
# targets (scripts/fuzz_build.sh: clang, libFuzzer, ASan + UBSan), replays
# every seed (fuzz/corpus/<t>) and every finding's reproducer
# (fuzz/regressions/<t>) once under the sanitizers, then fuzzes each target
# from them for a fixed number of inputs with a fixed seed (NCF_FUZZ_RUNS, default
# 2000; NCF_FUZZ_SEED, default 1), nproc targets at a time: the same inputs on every
# machine, however fast or loaded, so the step's outcome never depends on timing
# (bench/fuzz.sh fuzzes for long). What the short runs learn is thrown away; what they
# find is kept in build-fuzz/ci/findings/<t>/ and fails the step, with the log's end printed.
# NCF_FUZZ_INPUT_TIMEOUT (default 10) is the seconds of wall time after which one input is
# a hang: run_tests.sh raises it, running this at the lowest CPU priority beside the tests.
#   bash scripts/fuzz_replay.sh [target ...]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${NCF_FUZZ_BUILD_DIR:-$root/build-fuzz}"
runs="${NCF_FUZZ_RUNS:-2000}"
seed="${NCF_FUZZ_SEED:-1}"
[[ "$runs" =~ ^[1-9][0-9]*$ ]] ||
  { echo "fuzz_replay: NCF_FUZZ_RUNS '$runs' is not a positive number of inputs" >&2; exit 2; }
[[ "$seed" =~ ^[1-9][0-9]*$ ]] ||
  { echo "fuzz_replay: NCF_FUZZ_SEED '$seed' is not a positive integer" >&2; exit 2; }
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for f in "$root"/fuzz/fuzz_*.cc; do
    t="$(basename "$f" .cc)"
    [ "$t" = fuzz_util ] || targets+=("${t#fuzz_}")
  done
fi
t0=$SECONDS
bash "$root/scripts/fuzz_build.sh"
echo "fuzz_replay: built the fuzz targets in $((SECONDS - t0)) s" >&2

ci="$build/ci"
rm -rf "$ci"
mkdir -p "$ci"
input_timeout="${NCF_FUZZ_INPUT_TIMEOUT:-10}"
[[ "$input_timeout" =~ ^[1-9][0-9]*$ ]] ||
  { echo "fuzz_replay: NCF_FUZZ_INPUT_TIMEOUT '$input_timeout' is not a positive number of seconds" >&2; exit 2; }
flags=(-timeout="$input_timeout" -rss_limit_mb=2048 -malloc_limit_mb=2048)
# Stack traces for undefined behaviour too (ASan prints its own).
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1}"

# Replay, then a short fuzz; the exit status is the target's first failure.
one() {
  local t="$1" bin="$build/fuzz_$1" log="$ci/$1.log"
  local dirs=("$root/fuzz/corpus/$t")
  [ -d "$root/fuzz/regressions/$t" ] && dirs+=("$root/fuzz/regressions/$t")
  mkdir -p "$ci/corpus/$t" "$ci/findings/$t"
  {
    "$bin" "${flags[@]}" -runs=0 -artifact_prefix="$ci/findings/$t/" "${dirs[@]}" &&
      "$bin" "${flags[@]}" -runs="$runs" -seed="$seed" -print_final_stats=1 \
        -artifact_prefix="$ci/findings/$t/" "$ci/corpus/$t" "${dirs[@]}"
  } >"$log" 2>&1
}

t1=$SECONDS
pids=()
names=()
failed=()
for t in "${targets[@]}"; do
  if [ ${#pids[@]} -ge "$(nproc)" ]; then
    if ! wait "${pids[0]}"; then failed+=("${names[0]}"); fi
    pids=("${pids[@]:1}")
    names=("${names[@]:1}")
  fi
  one "$t" &
  pids+=($!)
  names+=("$t")
done
for k in "${!pids[@]}"; do
  if ! wait "${pids[$k]}"; then failed+=("${names[$k]}"); fi
done

total=0
for t in "${targets[@]}"; do
  n="$(sed -n 's/^stat::number_of_executed_units: *//p' "$ci/$t.log" | tail -1)"
  total=$((total + ${n:-0}))
done
echo "fuzz_replay: ${#targets[@]} targets: seeds and regressions replayed, then $runs inputs" \
  "of each from seed $seed ($total inputs) in $((SECONDS - t1)) s; $((SECONDS - t0)) s in all" >&2
if [ ${#failed[@]} -gt 0 ]; then
  for t in "${failed[@]}"; do
    echo "fuzz_replay: fuzz_$t FAILED; the end of $ci/$t.log:" >&2
    tail -n 40 "$ci/$t.log" >&2
    ls "$ci/findings/$t" >&2 || true
  done
  exit 1
fi
