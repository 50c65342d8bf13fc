#!/usr/bin/env bash
# Quick start #1: set up, build, generate the embedded default dataset (the
# synthetic "small" shape), verify it, and train NeuMF on it with one rank.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/build.sh"
build="${NCF_BUILD_DIR:-$root/build}"
data="$root/data/small"
"$build/src/ncf_prep" --synthetic small --eval_negatives 99 --record_rows 4096 --num_shards 2 \
  --output "$data"
"$build/src/ncf_prep" --verify "$data"
"$build/src/ncf_dist" --data_dir "$data" --preset ncf-paper --batch_size 2560 --train_epochs 8 \
  --metrics_json "$root/data/small-metrics.jsonl"
