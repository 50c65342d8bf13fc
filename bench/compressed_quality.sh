#!/usr/bin/env bash
# Quality of the compressed-embedding options against FP32 + dense Adam, and the sweep
# behind the embedding optimizers' default rates: HR@10 and NDCG@10 on a synthetic shape
# (--shape: ml-1m, 6,040 users, 3,706 items, about 1M ratings, the default; or ml-100k,
# 943 users, 1,682 items, 100,000 ratings), 99 eval negatives, under two protocols:
#   paper   --preset ncf-paper (batch 256, lr 0.001, factors 8, layers 64,32,16,8, 4
#           negatives), --epochs epochs (20: the preset's whole schedule)
#   large   the same model at batch 65,536 with lr 0.004 (few, large steps: ml-20m-like,
#           the stand-in for --preset ml-20m-mlperf), --large_epochs epochs
# Stages, each on the protocols it names (--compare, --sweep; "" for none):
#   compare  for each seed of --seeds at --ranks W ranks (mpirun --oversubscribe when
#            W > 1): FP32 + dense Adam; --exchange_dtype bf16; --table_dtype bf16; both;
#            --embedding_optimizer rowwise_adagrad at its default rate (no --embedding_lr);
#            and the control, fp32_reordered (--dedup on: the same model, float sums in
#            another order), whose difference is the noise of any change.
#            The table gives each option's mean over the seeds, the spread (min..max) and
#            its difference from dense Adam of the same seed.
#   sweep    one rank, the first seed: sgd, adagrad and rowwise_adagrad at each rate of
#            --sgd_lrs, --adagrad_lrs, --rowwise_lrs, against dense Adam (final and best
#            epoch's HR@10).
# Runs go --jobs at a time (each W ranks): the figures do not depend on the timing.
#
#   bash bench/compressed_quality.sh [--compare paper] [--sweep paper,large]
#        [--epochs 20] [--large_epochs 10] [--seeds 1,2,3] [--ranks 2] [--jobs 2]
#        [--sgd_lrs 10,30,100] [--adagrad_lrs 3,10,30] [--rowwise_lrs 0.03,0.1,0.3]
#        [--shape ml-1m|ml-100k] [--out DIR] [--data DIR]
#
# Writes OUT/runs/<protocol>-<option>[-s<seed>].{jsonl,log}, OUT/runs.tsv and
# OUT/quality.md. Not a test: the figures are a model's quality on synthetic data.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
prog=compressed_quality.sh
die() { echo "$prog: $*" >&2; exit 1; }

compare=paper
sweep=paper,large
epochs=20
large_epochs=10
seeds=1,2,3
ranks=2
jobs=2
sgd_lrs=10,30,100
adagrad_lrs=3,10,30
rowwise_lrs=0.03,0.1,0.3
# shellcheck source=bench/lib.sh
source "$root/bench/lib.sh"
commit=$(bench_commit "$root")
out="$root/bench/results/compressed_quality_$(date -u +%F)_$commit"
shape=ml-1m
data=
while [ $# -gt 0 ]; do
  case "$1" in
    --compare) compare="$2"; shift 2 ;;
    --sweep) sweep="$2"; shift 2 ;;
    --epochs) epochs="$2"; shift 2 ;;
    --large_epochs) large_epochs="$2"; shift 2 ;;
    --seeds) seeds="$2"; shift 2 ;;
    --ranks) ranks="$2"; shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    --sgd_lrs) sgd_lrs="$2"; shift 2 ;;
    --adagrad_lrs) adagrad_lrs="$2"; shift 2 ;;
    --rowwise_lrs) rowwise_lrs="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --data) data="$2"; shift 2 ;;
    --shape) shape="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
done
bench_positive_ints epochs large_epochs ranks jobs
for v in sgd_lrs adagrad_lrs rowwise_lrs; do
  [[ "${!v}" =~ ^[0-9.]+(,[0-9.]+)*$ ]] || die "--$v '${!v}' is not a comma-separated list of rates"
done
[[ "$seeds" =~ ^[0-9]+(,[0-9]+)*$ ]] || die "--seeds '$seeds' is not a comma-separated list"
for v in compare sweep; do
  [[ "${!v}" =~ ^((paper|large)(,(paper|large))*)?$ ]] || die "--$v '${!v}' (paper, large or both)"
done
case "$shape" in
  ml-1m) shape_flags=(--synthetic ml-1m) ;;
  ml-100k) shape_flags=(--synthetic custom --users 943 --items 1682 --interactions 100000) ;;
  *) die "--shape '$shape' (ml-1m or ml-100k)" ;;
esac
data="${data:-/var/tmp/ncf-bench/${shape/-/}-shape-99}"
IFS=, read -r -a COMPARE <<<"$compare"
IFS=, read -r -a SWEEP <<<"$sweep"
IFS=, read -r -a SEEDS <<<"$seeds"

build="${NCF_BUILD_DIR:-$root/build}"
bench_programs "$build"  # sets dist, prep
mkdir -p "$out/runs"
if [ ! -f "$data/metadata.json" ]; then
  mkdir -p "$(dirname "$data")"
  "$prep" "${shape_flags[@]}" --eval_negatives 99 --output "$data" --progress off >"$out/prep.log" 2>&1 ||
    { cat "$out/prep.log" >&2; die "ncf_prep failed"; }
fi
{
  echo "date: $(date -u +%FT%TZ)"
  echo "commit: $commit (ncf_dist: $build)"
  echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores"
  echo "data: $data (synthetic $shape shape: $(tr -d '\n ' <"$data/metadata.json" | grep -o '"num_\(users\|items\|train\)":[0-9]*' | sort -u | tr '\n' ' '))"
  echo "settings: epochs $epochs (paper) / $large_epochs (large); compare: ${compare:-none}, seeds $seeds"
  echo "  at $ranks rank(s); sweep: ${sweep:-none}, one rank, seed ${SEEDS[0]},"
  echo "  sgd $sgd_lrs, adagrad $adagrad_lrs, rowwise_adagrad $rowwise_lrs"
} >"$out/settings.txt"

run() {  # protocol tag ranks seed flags...
  local p="$1" tag="$2" w="$3" seed="$4" base launch=()
  shift 4
  case "$p" in
    paper) base=(--preset ncf-paper --train_epochs "$epochs") ;;
    large) base=(--preset ncf-paper --batch_size 65536 --learning_rate 0.004 --train_epochs "$large_epochs") ;;
  esac
  [ "$w" -gt 1 ] && launch=(env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    mpirun -np "$w" --oversubscribe)
  rm -f "$out/runs/$tag.jsonl"
  echo "$prog: $tag: W=$w ${base[*]} --seed $seed $*" >&2
  if "${launch[@]}" "$dist" --device cpu --data_dir "$data" --threads 1 --progress off "${base[@]}" \
    --seed "$seed" "$@" --metrics_json "$out/runs/$tag.jsonl" >"$out/runs/$tag.log" 2>&1; then
    printf '%s\t%s\t%s\t%s\t%s\n' "$tag" "$p" "$w" "$seed" "$*" >>"$out/runs.tsv"
  else
    echo "$prog: $tag failed: see $out/runs/$tag.log" >&2
    return 1
  fi
}

# The runs, one a line (protocol tag ranks seed flags...), then --jobs at a time.
: >"$out/runs.tsv"
: >"$out/queue"
queue() { echo "$*" >>"$out/queue"; }
for st in compare sweep; do
  [ "$st" = compare ] && PS=("${COMPARE[@]}") || PS=("${SWEEP[@]}")
  for p in "${PS[@]}"; do
    if [ "$st" = compare ]; then
      # The slowest first: BF16 rows with dense Adam round the whole table every step.
      for s in "${SEEDS[@]}"; do
        queue "$p" "$p-bf16_rows-s$s" "$ranks" "$s" --table_dtype bf16
        queue "$p" "$p-bf16_exchange_rows-s$s" "$ranks" "$s" --exchange_dtype bf16 --table_dtype bf16
      done
      for s in "${SEEDS[@]}"; do
        queue "$p" "$p-fp32_dense_adam-s$s" "$ranks" "$s"
        # The control: FP32 with each step's gradients of a repeated row summed before they
        # are sent, the same model up to the order of float sums; what it moves is the
        # spread of a change that costs nothing.
        queue "$p" "$p-fp32_reordered-s$s" "$ranks" "$s" --dedup on
        queue "$p" "$p-bf16_exchange-s$s" "$ranks" "$s" --exchange_dtype bf16
        queue "$p" "$p-rowwise_adagrad_default-s$s" "$ranks" "$s" --embedding_optimizer rowwise_adagrad
      done
    else
      s=${SEEDS[0]}
      queue "$p" "$p-sweep_dense_adam" 1 "$s"
      for o in sgd adagrad rowwise; do
        lrs_var="${o}_lrs"
        name=$o
        [ "$o" = rowwise ] && name=rowwise_adagrad
        IFS=, read -r -a LRS <<<"${!lrs_var}"
        for lr in "${LRS[@]}"; do
          queue "$p" "$p-sweep_${name}_lr$lr" 1 "$s" --embedding_optimizer "$name" --embedding_lr "$lr"
        done
      done
    fi
  done
done
failed=0
while read -r -a job; do
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || failed=1; done
  run "${job[@]}" </dev/null &
done <"$out/queue"
while [ "$(jobs -rp | wc -l)" -gt 0 ]; do wait -n || failed=1; done
rm -f "$out/queue"
[ "$failed" = 0 ] || die "some runs failed (see above)"

python3 - "$out" <<'PY'
import json, os, statistics, sys
out = sys.argv[1]
rows = [l.rstrip("\n").split("\t") for l in open(os.path.join(out, "runs.tsv")) if l.strip()]
def curve(tag):
    return [json.loads(x) for x in open(os.path.join(out, "runs", tag + ".jsonl")) if x.strip()]
md = ["# Compressed embeddings and embedding optimizers: quality against FP32 + dense Adam", "",
      "```", open(os.path.join(out, "settings.txt")).read().rstrip(), "```", ""]
compare, sweep = {}, []
for tag, p, w, seed, flags in ((r + [""])[:5] for r in rows):
    if "-sweep_" in tag:
        sweep.append((p, tag.split("-sweep_", 1)[1], flags, curve(tag)))
    else:
        option = tag.split("-", 1)[1].rsplit("-s", 1)[0]
        compare.setdefault((p, option), {"flags": flags, "w": w, "runs": {}})["runs"][seed] = curve(tag)
if compare:
    md += ["## Options against FP32 + dense Adam (final epoch; mean over seeds, min..max)", "",
           "| protocol | option | flags | W | epochs | seeds | HR@10 | HR@10 - dense Adam | "
           "per seed | NDCG@10 - dense Adam |",
           "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | --- | ---: |"]
    order = ["fp32_dense_adam", "fp32_reordered", "bf16_exchange", "bf16_rows",
             "bf16_exchange_rows", "rowwise_adagrad_default"]
    for (p, o), e in sorted(compare.items(), key=lambda kv: (kv[0][0], order.index(kv[0][1]))):
        base = compare[(p, "fp32_dense_adam")]["runs"]
        seeds = sorted(e["runs"], key=int)
        hr = [e["runs"][s][-1]["hr"] for s in seeds]
        d = [e["runs"][s][-1]["hr"] - base[s][-1]["hr"] for s in seeds]
        dn = [e["runs"][s][-1]["ndcg"] - base[s][-1]["ndcg"] for s in seeds]
        ep = e["runs"][seeds[0]][-1]["epoch"]
        md.append(f"| {p} | {o} | `{e['flags']}` | {e['w']} | {ep} | {len(seeds)} | "
                  f"{statistics.mean(hr):.4f} ({min(hr):.4f}..{max(hr):.4f}) | "
                  f"{statistics.mean(d):+.4f} ({min(d):+.4f}..{max(d):+.4f}) | "
                  + ", ".join(f"{x:+.4f}" for x in d) + f" | {statistics.mean(dn):+.4f} |")
    md.append("")
if sweep:
    md += ["## Embedding optimizers' rates (one rank, one seed)", "",
           "| protocol | run | flags | epochs | final HR@10 | best HR@10 (epoch) | final NDCG@10 |",
           "| --- | --- | --- | ---: | ---: | ---: | ---: |"]
    for p, name, flags, c in sweep:
        best = max(c, key=lambda r: r["hr"])
        md.append(f"| {p} | {name} | `{flags}` | {c[-1]['epoch']} | {c[-1]['hr']:.4f} | "
                  f"{best['hr']:.4f} ({best['epoch']}) | {c[-1]['ndcg']:.4f} |")
open(os.path.join(out, "quality.md"), "w").write("\n".join(md) + "\n")
print("\n".join(md))
PY
