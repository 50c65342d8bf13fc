#!/usr/bin/env bash
# Daily retraining measured: a log with times cut in two periods (day 1: the
# first 80% of the rows by time, day 2: the rest; scripts/make_log.py), then
#   warm:    day 2's rows only (ncf_prep --extend day1), from day 1's checkpoint
#            (ncf_dist --init_from);
#   scratch: days 1 + 2 (ncf_prep --extend day1 of the whole log, so the ids,
#            positives and eval lists are day 2's), from scratch.
# Both are evaluated on day 2's held-out items (HR@10, NDCG@10); the record
# gives both, their training times and the ratio, and whether the two eval sets
# are the same files. Also: the warm-started model before its first step,
# evaluated on day 2 (what day 1's model is worth on day 2).
#
#   bench/warm_start.sh [--users N] [--items N] [--rows N] [--epochs E] [--out DIR]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"
die() { echo "warm_start.sh: $*" >&2; exit 1; }
users=20000 items=3000 rows=1000000 epochs=6 out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --users) users=$2; shift 2 ;;
    --items) items=$2; shift 2 ;;
    --rows) rows=$2; shift 2 ;;
    --epochs) epochs=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) die "unknown argument $1" ;;
  esac
done
BUILD=${NCF_BUILD_DIR:-$ROOT/build}
bench_programs "$BUILD"
commit=$(bench_commit "$ROOT")
[ -n "$out" ] || out="$ROOT/bench/results/warm_start_$(date +%F)_$commit"
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
csv=(--format csv --columns "user=user,item=item,timestamp=ts" --eval_negatives 99)
model=(--batch_size 8192 --learning_rate 0.002 --layers "64,32,16" --num_factors 16 --seed 1)
log="$out/log.txt"
: >"$log"
run() { echo "\$ $*" >>"$log"; "$@" >>"$log" 2>&1; }
secs() { grep -E '^ +[0-9]+ ' "$1" | awk '{s += $5} END {printf "%.2f", s}'; }
last_hr() { grep -E '^ +[0-9]+ ' "$1" | tail -1 | awk '{print $3, $4}'; }

python3 "$ROOT/scripts/make_log.py" --users "$users" --items "$items" --rows "$rows" --days 2 \
  --out "$work/logs"
run "$prep" --input "$work/logs/day-1.csv" "${csv[@]}" --output "$work/day1"
run "$prep" --input "$work/logs/day-2.csv" "${csv[@]}" --extend "$work/day1" --output "$work/day2"
run "$prep" --input "$work/logs/days-1-2.csv" "${csv[@]}" --extend "$work/day1" \
  --output "$work/days12"
run "$dist" --data_dir "$work/day1" "${model[@]}" --train_epochs "$epochs" \
  --checkpoint_dir "$work/ck1"
"$dist" --data_dir "$work/day2" "${model[@]}" --init_from "$work/ck1" --eval_only \
  >"$work/before.txt" 2>&1
"$dist" --data_dir "$work/day2" "${model[@]}" --init_from "$work/ck1" \
  --train_epochs "$epochs" >"$work/warm.txt" 2>&1
"$dist" --data_dir "$work/days12" "${model[@]}" --train_epochs "$epochs" >"$work/scratch.txt" 2>&1
cat "$work/before.txt" "$work/warm.txt" "$work/scratch.txt" >>"$log"
# The same ids and positives give the same eval lists (held-out item and
# negatives are functions of them and the seed); the shard files differ in
# their dataset ids only.
same_eval=no
sums() { (cd "$1" && cat user_ids.str item_ids.str positives.bin | md5sum); }
if [ "$(sums "$work/day2")" = "$(sums "$work/days12")" ]; then
  same_eval=yes
fi
read -r warm_hr warm_ndcg < <(last_hr "$work/warm.txt")
read -r scratch_hr scratch_ndcg < <(last_hr "$work/scratch.txt")
warm_s=$(secs "$work/warm.txt")
scratch_s=$(secs "$work/scratch.txt")
before=$(grep -o 'sampled HR@10 [0-9.]* NDCG@10 [0-9.]*' "$work/before.txt" | head -1)
{
  echo "# warm start vs retraining, $(date -u +%FT%TZ), commit $commit"
  echo "machine: $(nproc) cores, $(uname -m), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
  echo "command: bench/warm_start.sh --users $users --items $items --rows $rows --epochs $epochs"
  echo "log: $(wc -l <"$work/logs/day-1.csv") + $(wc -l <"$work/logs/day-2.csv") rows (headers included)"
  echo "eval: day 2's held-out items, 99 negatives; same ids and positives (so the same eval lists) for both: $same_eval"
  echo "day 1's model on day 2 before training: $before"
  echo "warm    (day 2 only, --init_from):  HR@10 $warm_hr NDCG@10 $warm_ndcg, train ${warm_s} s"
  echo "scratch (days 1 + 2, from scratch): HR@10 $scratch_hr NDCG@10 $scratch_ndcg, train ${scratch_s} s"
  awk -v w="$warm_hr" -v s="$scratch_hr" -v a="$warm_s" -v b="$scratch_s" \
    'BEGIN {printf "HR difference (warm - scratch): %+.4f; time ratio warm / scratch: %.3f\n", w - s, a / b}'
} | tee "$out/summary.txt"
