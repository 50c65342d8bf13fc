#!/usr/bin/env bash
# Quality of the compressed-embedding options against FP32 + dense Adam: HR@10 and
# NDCG@10 after the same epochs, on the synthetic ml-1m shape (6,040 users, 3,706 items,
# 99 eval negatives) under two protocols:
#   paper   --preset ncf-paper (batch 256, lr 0.001, factors 8, layers 64,32,16,8, 4 negatives)
#   large   the same model at batch 65,536 with lr 0.004 (few, large steps: ml-20m-like)
# Options per protocol: FP32 + dense Adam; --exchange_dtype bf16; --table_dtype bf16; both;
# row-wise Adagrad at each --embedding_lr of a small sweep; then at the sweep's best rate
# with BF16 rows, and with BF16 rows and payloads (the most compact setting). One rank:
# with BF16 payloads one rank rounds the rows and gradients a larger W would send, and
# BF16 rows round the same at any W (docs/distributed.md), so W = 1 computes what W = N does.
#
#   bash bench/compressed_quality.sh [--epochs 3] [--large_epochs 10]
#        [--lrs 0.01,0.03,0.1,0.3] [--protocols paper,large] [--out DIR] [--data DIR]
#
# Writes OUT/runs/<protocol>-<option>.{jsonl,log} and OUT/quality.md. Not a test: the
# figures are a model's quality on synthetic data, reported side by side.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
prog=compressed_quality.sh
die() { echo "$prog: $*" >&2; exit 1; }

epochs=3
large_epochs=10
lrs=0.01,0.03,0.1,0.3
protocols=paper,large
# shellcheck source=bench/lib.sh
source "$root/bench/lib.sh"
commit=$(bench_commit "$root")
out="$root/bench/results/compressed_quality_$(date -u +%F)_$commit"
data=/var/tmp/ncf-bench/ml1m-shape-99
while [ $# -gt 0 ]; do
  case "$1" in
    --epochs) epochs="$2"; shift 2 ;;
    --large_epochs) large_epochs="$2"; shift 2 ;;
    --lrs) lrs="$2"; shift 2 ;;
    --protocols) protocols="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --data) data="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
done
bench_positive_ints epochs large_epochs
[[ "$lrs" =~ ^[0-9.]+(,[0-9.]+)*$ ]] || die "--lrs '$lrs' is not a comma-separated list of rates"
[[ "$protocols" =~ ^(paper|large)(,(paper|large))*$ ]] || die "--protocols '$protocols' (paper, large)"
IFS=, read -r -a LRS <<<"$lrs"
IFS=, read -r -a PROTOCOLS <<<"$protocols"

build="${NCF_BUILD_DIR:-$root/build}"
bench_programs "$build"  # sets dist, prep
mkdir -p "$out/runs"
if [ ! -f "$data/metadata.json" ]; then
  mkdir -p "$(dirname "$data")"
  "$prep" --synthetic ml-1m --eval_negatives 99 --output "$data" --progress off >"$out/prep.log" 2>&1 ||
    { cat "$out/prep.log" >&2; die "ncf_prep failed"; }
fi
{
  echo "date: $(date -u +%FT%TZ)"
  echo "commit: $commit (ncf_dist: $build)"
  echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores"
  echo "data: $data ($(tr -d '\n' <"$data/metadata.json" | grep -o '"num_users": *[0-9]*'), synthetic ml-1m shape)"
  echo "settings: protocols $protocols, epochs $epochs (paper) / $large_epochs (large), lrs $lrs"
} >"$out/settings.txt"

run() {  # protocol option flags...
  local p="$1" o="$2" base
  shift 2
  case "$p" in
    paper) base=(--preset ncf-paper --train_epochs "$epochs") ;;
    large) base=(--preset ncf-paper --batch_size 65536 --learning_rate 0.004 --train_epochs "$large_epochs") ;;
  esac
  local tag="$p-$o"
  rm -f "$out/runs/$tag.jsonl"
  echo "$prog: $tag: ${base[*]} $*" >&2
  "$dist" --device cpu --data_dir "$data" --threads 1 --progress off "${base[@]}" "$@" \
    --metrics_json "$out/runs/$tag.jsonl" >"$out/runs/$tag.log" 2>&1 ||
    die "$tag failed: see $out/runs/$tag.log"
  echo "$tag	$*" >>"$out/runs.tsv"
}

best_lr() {  # protocol -> the sweep's rate with the highest final HR@10
  local p="$1" best="" hr=-1 h lr
  for lr in "${LRS[@]}"; do
    h=$(tail -1 "$out/runs/$p-rowwise_adagrad_lr$lr.jsonl" | grep -o '"hr":[0-9.e-]*' | cut -d: -f2)
    if awk -v a="$h" -v b="$hr" 'BEGIN{exit !(a > b)}'; then best=$lr hr=$h; fi
  done
  echo "$best"
}

: >"$out/runs.tsv"
for p in "${PROTOCOLS[@]}"; do
  run "$p" fp32_dense_adam
  run "$p" bf16_exchange_dense_adam --exchange_dtype bf16
  run "$p" bf16_rows_dense_adam --table_dtype bf16
  run "$p" bf16_exchange_rows_dense_adam --exchange_dtype bf16 --table_dtype bf16
  for lr in "${LRS[@]}"; do
    run "$p" "rowwise_adagrad_lr$lr" --embedding_optimizer rowwise_adagrad --embedding_lr "$lr"
  done
  lr=$(best_lr "$p")
  run "$p" "bf16_rows_rowwise_adagrad_lr$lr" --table_dtype bf16 \
    --embedding_optimizer rowwise_adagrad --embedding_lr "$lr"
  run "$p" "bf16_exchange_rows_rowwise_adagrad_lr$lr" --exchange_dtype bf16 --table_dtype bf16 \
    --embedding_optimizer rowwise_adagrad --embedding_lr "$lr"
done

python3 - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]
rows = [line.rstrip("\n").split("\t") for line in open(os.path.join(out, "runs.tsv")) if line.strip()]
md = ["# Compressed embeddings: quality against FP32 + dense Adam", "", "```",
      open(os.path.join(out, "settings.txt")).read().rstrip(), "```", "",
      "| protocol | option | flags | epochs | HR@10 | NDCG@10 | HR@10 - baseline | NDCG@10 - baseline |",
      "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |"]
base = {}
for tag, flags in ((r[0], r[1] if len(r) > 1 else "") for r in rows):
    p, o = tag.split("-", 1)
    last = [json.loads(x) for x in open(os.path.join(out, "runs", tag + ".jsonl")) if x.strip()][-1]
    if o == "fp32_dense_adam":
        base[p] = last
    b = base.get(p, last)
    md.append(f"| {p} | {o} | `{flags}` | {last['epoch']} | {last['hr']:.4f} | {last['ndcg']:.4f} | "
              f"{last['hr'] - b['hr']:+.4f} | {last['ndcg'] - b['ndcg']:+.4f} |")
open(os.path.join(out, "quality.md"), "w").write("\n".join(md) + "\n")
print("\n".join(md))
PY
