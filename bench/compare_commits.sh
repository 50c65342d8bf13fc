#!/usr/bin/env bash
# Two commits of ncf_dist side by side in one run, on the same data and machine:
#   bash bench/compare_commits.sh BEFORE AFTER [OUT]
# Builds each commit (CPU, Release) in a worktree under $NCF_BENCH_DATA, then,
# REPS times and alternating the two builds, times:
#   synthetic ml-1m shape, batch 65,536, dense Adam, no eval: W = 1 (2 threads)
#                                 and W = 2 (mpirun --oversubscribe, 1 thread each),
#                                 the latter also with --shard_plan row;
#   synthetic ml-20m shape, --preset ml-20m-mlperf, W = 1 (2 threads).
# Also logs each build's per-step collectives and bytes (--step_log; the older
# log has no collective count). Writes the raw log to OUT (default
# bench/results/compare_<before>_<after>.txt) and a table to OUT with .md.
#   Optional (CASES): synthetic ml-20m shape at batch 65,536, 64 steps, --precision fp32
#                                 and bf16, W = 1 (2 threads).
# Env: NCF_BENCH_DATA (default /tmp/ncf-compare), REPS (default 3), CASES (default
# "ml1m_w1 ml1m_w2 ml1m_w2_row ml20m_w1"; also ml20m_b65k_fp32, ml20m_b65k_bf16).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
[ $# -ge 2 ] || { echo "usage: $0 BEFORE AFTER [OUT]" >&2; exit 2; }
before=$(git -C "$root" rev-parse --short "$1")
after=$(git -C "$root" rev-parse --short "$2")
out="${3:-$root/bench/results/compare_${before}_${after}.txt}"
work="${NCF_BENCH_DATA:-/tmp/ncf-compare}"
reps="${REPS:-3}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p "$work"
bash "$root/scripts/setup.sh"

build() {  # build COMMIT: a CPU Release build of COMMIT in its own worktree
  local c=$1 dir="$work/src-$1"
  [ -d "$dir" ] || git -C "$root" worktree add --detach -f "$dir" "$c" >/dev/null
  if [ ! -x "$dir/build/src/ncf_dist" ]; then
    cmake -S "$dir" -B "$dir/build" -DCMAKE_BUILD_TYPE=Release -DNCF_CUDA=OFF >/dev/null
    cmake --build "$dir/build" -j "$(nproc)" --target ncf_dist ncf_prep >/dev/null
  fi
}
build "$before"
build "$after"
# Each commit reads the data its own ncf_prep writes (the dataset format may
# differ between them; the synthetic content is the same for the same seed).
for c in "$before" "$after"; do
  prep="$work/src-$c/build/src/ncf_prep"
  [ -f "$work/data-$c/ml1m/metadata.json" ] ||
    "$prep" --synthetic ml-1m --eval_negatives 99 --output "$work/data-$c/ml1m" \
      --progress off >/dev/null
  [ -f "$work/data-$c/ml20m/metadata.json" ] ||
    "$prep" --synthetic ml-20m --output "$work/data-$c/ml20m" --progress off >/dev/null
done

declare -A cases=(
  [ml1m_w1]="1|--data_dir @DATA@/ml1m --batch_size 65536 --train_epochs 2 --no_eval --threads 2"
  [ml1m_w2]="2|--data_dir @DATA@/ml1m --batch_size 65536 --train_epochs 2 --no_eval --threads 1"
  [ml1m_w2_row]="2|--data_dir @DATA@/ml1m --batch_size 65536 --train_epochs 2 --no_eval --threads 1 --shard_plan row"
  [ml20m_w1]="1|--data_dir @DATA@/ml20m --preset ml-20m-mlperf --train_epochs 1 --max_steps 12 --no_eval --threads 2"
  [ml20m_b65k_fp32]="1|--data_dir @DATA@/ml20m --preset ml-20m-mlperf --batch_size 65536 --train_epochs 1 --max_steps 64 --no_eval --threads 2 --precision fp32"
  [ml20m_b65k_bf16]="1|--data_dir @DATA@/ml20m --preset ml-20m-mlperf --batch_size 65536 --train_epochs 1 --max_steps 64 --no_eval --threads 2 --precision bf16"
)
# CASES (space-separated) picks the cases; the ml20m_b65k ones are the CPU tower at the
# batch of bench/tower_speed.sh in both precisions.
read -r -a order <<<"${CASES:-ml1m_w1 ml1m_w2 ml1m_w2_row ml20m_w1}"
for c in "${order[@]}"; do
  [ -n "${cases[$c]:-}" ] || { echo "compare_commits: unknown case '$c' in CASES (known: ${!cases[*]})" >&2; exit 2; }
done

launch() {  # launch W: the launcher prefix for W ranks
  if [ "$1" = 1 ]; then echo ""; else echo "mpirun -np $1 --oversubscribe"; fi
}

{
  echo "# compare $before (before) and $after (after)"
  echo "# date: $(date -u +%FT%TZ)"
  echo "# machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores," \
    "$(free -g | awk '/^Mem:/{print $2}') GiB memory"
  for c in "${order[@]}"; do
    IFS='|' read -r W flags <<<"${cases[$c]}"
    for rep in $(seq "$reps"); do
      for side in before after; do
        commit=${!side}
        cmd="$(launch "$W") $work/src-$commit/build/src/ncf_dist ${flags//@DATA@/$work/data-$commit}"
        cmd+=" --progress off"
        echo "# load $(cut -d' ' -f1-3 /proc/loadavg)"
        echo "\$ $cmd"
        # The last epoch's samples/s (the first holds the warm-up).
        sps=$($cmd 2>&1 | awk '$1 ~ /^[0-9]+$/ && NF >= 6 {s = $6} END {print s}')
        echo "RESULT case=$c side=$side commit=$commit rep=$rep samples_per_s=$sps"
      done
    done
    for side in before after; do
      commit=${!side}
      # One epoch of 4 steps (the case's own epoch and step flags replaced).
      log_flags=$(echo "$flags" | sed -E 's/--train_epochs [0-9]+|--max_steps [0-9]+//g')
      cmd="$(launch "$W") $work/src-$commit/build/src/ncf_dist ${log_flags//@DATA@/$work/data-$commit}"
      cmd+=" --train_epochs 1"
      cmd+=" --max_steps 4 --progress off --step_log"
      echo "\$ $cmd"
      { $cmd 2>&1 || true; } | { grep '^step [23]:' || true; } |
        sed "s/^/STEPLOG case=$c side=$side: /"
    done
  done
} 2>&1 | tee "$out"

python3 "$root/bench/summarize_commits.py" "$out" "$before" "$after" >"${out%.txt}.md"
cat "${out%.txt}.md"
