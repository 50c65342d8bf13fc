#!/usr/bin/env bash
# What a checkpoint costs: seconds and bytes of the checkpoints ncf_dist
# writes, next to the time the same bytes take to write with dd on the same
# disk (the floor), for
#   - the synthetic ml-20m shape (--preset ml-20m-mlperf), W = 1 and W = 2;
#   - a 10^7-user table (synthetic custom: 10M users, 100k items, 30M
#     interactions), W = 1 and W = 2;
# and the time to find, check (CRC of every file) and load the newest one.
#   bash bench/checkpoint_cost.sh [OUT]     (default bench/results/checkpoint_cost_<date>_<commit>.txt)
# Env: NCF_BENCH_DATA (default /tmp/ncf-ckpt-bench), BUILD (default build-bench).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
commit=$(git -C "$root" rev-parse --short HEAD)
out="${1:-$root/bench/results/checkpoint_cost_$(date -u +%F)_$commit.txt}"
work="${NCF_BENCH_DATA:-/tmp/ncf-ckpt-bench}"
build="$root/${BUILD:-build-bench}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
bash "$root/scripts/setup.sh"
mkdir -p "$work"
if [ ! -x "$build/src/ncf_dist" ]; then
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DNCF_CUDA=OFF >/dev/null
fi
cmake --build "$build" -j "$(nproc)" --target ncf_dist ncf_prep >/dev/null
prep="$build/src/ncf_prep"
dist="$build/src/ncf_dist"
[ -f "$work/ml20m/metadata.json" ] ||
  "$prep" --synthetic ml-20m --output "$work/ml20m" --progress off >/dev/null
[ -f "$work/u10m/metadata.json" ] ||
  "$prep" --synthetic custom --users 10000000 --items 100000 --interactions 30000000 --min_per_user 3 \
    --eval_negatives 99 --output "$work/u10m" --progress off >/dev/null

{
  echo "# checkpoint cost at $commit"
  echo "# date: $(date -u +%FT%TZ)"
  echo "# machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores," \
    "$(free -g | awk '/^Mem:/{print $2}') GiB memory; disk: $(df -h "$work" | awk 'NR==2{print $1}')"
  for case in ml20m u10m; do
    for W in 1 2; do
      if [ "$case" = ml20m ]; then
        flags="--device cpu --data_dir $work/ml20m --preset ml-20m-mlperf --max_steps 2"
      else
        flags="--device cpu --data_dir $work/u10m --batch_size 65536 --max_steps 2"
      fi
      launch=""
      [ "$W" -gt 1 ] && launch="mpirun -np $W --oversubscribe"
      ck="$work/ck-$case-w$W"
      rm -rf "$ck"
      cmd="$launch $dist $flags --train_epochs 1 --no_eval --threads $((2 / W)) --progress off \
--checkpoint_dir $ck --checkpoint_every_steps 1 --keep_checkpoints 1"
      echo "## $case W=$W: $cmd"
      $cmd 2>&1 | grep -E "checkpoint |samples/s|^ +1 " || true
      last=$(ls -d "$ck"/step-* | tail -1)
      bytes=$(du -sb "$last" | cut -f1)
      # The floor: the checkpoint's own files copied with dd and fsynced, on the
      # same disk (zeros would flatter a thin-provisioned virtual disk).
      sync
      mkdir -p "$work/dd"
      t0=$(date +%s.%N)
      for f in "$last"/*; do
        dd if="$f" of="$work/dd/$(basename "$f")" bs=8M conv=fsync status=none
      done
      t1=$(date +%s.%N)
      rm -rf "$work/dd"
      echo "dd copy of the same $bytes bytes with fsync: $(awk "BEGIN{printf \"%.2f\", $t1 - $t0}") s"
      # Finding, checking and loading it (one more step after the resume).
      t0=$(date +%s.%N)
      $launch $dist $flags --train_epochs 1 --no_eval --threads $((2 / W)) --progress off \
        --checkpoint_dir "$ck" --resume auto \
        2>&1 | grep -E "resuming" || true
      t1=$(date +%s.%N)
      echo "resume run (start, check, load, no steps left): $(awk "BEGIN{printf \"%.2f\", $t1 - $t0}") s"
      rm -rf "$ck"
    done
  done
} | tee "$out"
