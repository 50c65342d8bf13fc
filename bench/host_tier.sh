#!/usr/bin/env bash
# The host tier (--device_table_budget) on CPU ranks, where the cache is an arena of host
# memory and every move is a copy: first, at each world size, one run without a budget and
# one at each budget, their final parameters compared byte for byte and their losses, HR and
# NDCG compared as printed ("min" is the largest step's rows, read from the 100% run); then
# the cost of the mechanism itself, the tier at 100% (every row cached in its own slot, so
# the gathers and updates need no slot map; the ids still announced ahead, the window kept
# and every row copied in at its first use) against no tier, alternated, the median and the
# fastest training seconds of each, at W = 1 and 2, in two epochs: the first loads every
# row at its first use, the second (the steady state) finds nearly all of them there.
#
#   bash bench/host_tier.sh [--users 200000] [--items 20000] [--interactions 4200000]
#        [--batch 16384] [--steps 100] [--overhead_steps 400] [--worlds 1,2,4]
#        [--budgets 100%,30%,10%,min] [--repeats 5] [--optimizer rowwise_adagrad] [--out DIR]
#        [--data DIR] [--lookahead 2]
#
# --lookahead: every run's --lookahead_steps (a number, or auto); a fixed 2 by default, so that
# the smallest budget, below two steps' rows, evicts rows inside their window.
#
# Writes OUT/runs/*.log, OUT/identity.md, OUT/overhead.md and OUT/host_tier.md. Not a test.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
prog=host_tier.sh
die() { echo "$prog: $*" >&2; exit 1; }

users=200000
items=20000
interactions=4200000
batch=16384
steps=100
overhead_steps=400
worlds=1,2,4
budgets=100%,30%,10%,min
repeats=5
optimizer=rowwise_adagrad
lookahead=2
# shellcheck source=bench/lib.sh
source "$root/bench/lib.sh"
commit=$(bench_commit "$root")
out="$root/bench/results/host_tier_$(date -u +%F)_$commit"
data=""
while [ $# -gt 0 ]; do
  case "$1" in
    --users) users="$2"; shift 2 ;;
    --items) items="$2"; shift 2 ;;
    --interactions) interactions="$2"; shift 2 ;;
    --batch) batch="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --overhead_steps) overhead_steps="$2"; shift 2 ;;
    --worlds) worlds="$2"; shift 2 ;;
    --budgets) budgets="$2"; shift 2 ;;
    --repeats) repeats="$2"; shift 2 ;;
    --optimizer) optimizer="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --data) data="$2"; shift 2 ;;
    --lookahead) lookahead="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
done
bench_positive_ints users items interactions batch steps overhead_steps repeats
[[ "$lookahead" =~ ^([0-9]+|auto)$ ]] || die "--lookahead '$lookahead' is not a step count or auto"
la_flag="$lookahead"
[ "$lookahead" = auto ] && la_flag=-1
[[ "$worlds" =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] || die "--worlds '$worlds' is not a list of rank counts"
[[ "$budgets" =~ ^(min|[0-9.]+%|[0-9.]+[KMGT]?)(,(min|[0-9.]+%|[0-9.]+[KMGT]?))*$ ]] ||
  die "--budgets '$budgets' is not a list of budgets (30%, 64M, min)"
IFS=, read -r -a WORLDS <<<"$worlds"
IFS=, read -r -a BUDGETS <<<"$budgets"
data="${data:-/var/tmp/ncf-bench/u${users}-i${items}-n${interactions}}"

build="${NCF_BUILD_DIR:-$root/build}"
bench_programs "$build"  # sets dist, prep
mkdir -p "$out/runs"
if [ ! -f "$data/metadata.json" ]; then
  echo "$prog: writing the synthetic dataset to $data"
  "$prep" --synthetic custom --users "$users" --items "$items" --interactions "$interactions" \
    --eval_negatives 99 --seed 3 --output "$data" >"$out/runs/prep.log" 2>&1 ||
    die "ncf_prep failed: $(tail -3 "$out/runs/prep.log")"
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# run NAME W FLAGS...: $run_epochs epoch(s) of $run_steps steps; its log, metrics and
# parameters in runs/.
run_steps=$steps
run_epochs=1
run() {
  local name="$1" W="$2"
  shift 2
  local launch=()
  [ "$W" -gt 1 ] && launch=(mpirun -np "$W" --oversubscribe --bind-to none)
  "${launch[@]}" "$dist" --device cpu --data_dir "$data" --batch_size "$batch" --train_epochs "$run_epochs" \
    --max_steps "$run_steps" --threads 1 --embedding_optimizer "$optimizer" \
    --lookahead_steps "$la_flag" \
    --metrics_json "$out/runs/$name.jsonl" --save_params "$out/runs/$name.bin" "$@" \
    >"$out/runs/$name.log" 2>&1 || die "$name failed: $(tail -3 "$out/runs/$name.log")"
}
field() { python3 -c "import json,sys; print(json.loads(open(sys.argv[1]).readlines()[-1])$2)" "$1"; }
# epoch_field FILE K EXPR: EXPR of epoch K's line (0 the first).
epoch_field() { python3 -c "import json,sys; print(json.loads(open(sys.argv[1]).readlines()[int(sys.argv[2])])$3)" "$1" "$2"; }

{
  echo "| W | budget | cache rows (rank 0) | loss, HR, NDCG | parameters | waits | written back | evicted inside their window |"
  echo "| ---: | --- | ---: | --- | --- | ---: | ---: | ---: |"
} >"$out/identity.md"
for W in "${WORLDS[@]}"; do
  run "w${W}_ref" "$W"
  run "w${W}_100" "$W" --device_table_budget 100%
  min_rows=$(field "$out/runs/w${W}_100.jsonl" "['host_tier']['most_step_rows']")
  row_bytes=$(field "$out/runs/w${W}_100.jsonl" "['host_tier']['cache_row_bytes']")
  ref_line=$(field "$out/runs/w${W}_ref.jsonl" "['loss'], ['hr'], ['ndcg']")
  for b in "${BUDGETS[@]}"; do
    name="w${W}_${b%\%}"
    flag="$b"
    [ "$b" = min ] && flag=$((min_rows * row_bytes))
    [ "$b" = 100% ] || run "$name" "$W" --device_table_budget "$flag"
    line=$(field "$out/runs/$name.jsonl" "['loss'], ['hr'], ['ndcg']")
    same_metrics=differ
    [ "$line" = "$ref_line" ] && same_metrics=identical
    same_params=differ
    cmp -s "$out/runs/w${W}_ref.bin" "$out/runs/$name.bin" && same_params="identical ($(stat -c %s "$out/runs/$name.bin") bytes)"
    t() { field "$out/runs/$name.jsonl" "['host_tier']['$1']"; }
    echo "| $W | $b ($flag) | $(t cache_rows) | $same_metrics | $same_params | $(t waits) of $(t steps) | $(t evictions) | $(t evicted_in_window) |" >>"$out/identity.md"
  done
done

# The mechanism's cost at 100%: no tier and the tier alternated, two epochs each: the
# first loads every row it meets into the cache; in the second (the steady state) they are
# all there.
run_steps=$overhead_steps
run_epochs=2
: >"$out/runs/overhead.txt"
for r in $(seq 1 "$repeats"); do
  for setting in "w2 2" "w1 1"; do
    read -r tag W <<<"$setting"
    for mode in off on; do
      flags=()
      [ "$mode" = on ] && flags=(--device_table_budget 100%)
      name="overhead_${tag}_${mode}_$r"
      run "$name" "$W" --no_eval "${flags[@]}"
      for e in 0 1; do
        echo "$tag-e$((e + 1)) $mode $(epoch_field "$out/runs/$name.jsonl" "$e" "['train_seconds']")" \
          >>"$out/runs/overhead.txt"
      done
    done
  done
done
python3 - "$out/runs/overhead.txt" "$overhead_steps" >"$out/overhead.md" <<'EOF'
import statistics, sys
times = {}
for line in open(sys.argv[1]):
    tag, mode, sec = line.split()
    times.setdefault(tag, {"off": [], "on": []})[mode].append(float(sec))
steps = int(sys.argv[2])
names = {"w2-e2": "W = 2, epoch 2 (steady)", "w1-e2": "W = 1, epoch 2 (steady)",
         "w2-e1": "W = 2, epoch 1 (first loads)", "w1-e1": "W = 1, epoch 1 (first loads)"}
# The median and the fastest run of each: on a shared machine another tenant's load only
# ever slows a run, so the fastest is the least disturbed one.
print("| setting | median s, no tier | median s, tier at 100% | ratio | fastest, no tier | "
      "fastest, tier | ratio | runs (no tier; tier) |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
for tag in ["w2-e2", "w1-e2", "w2-e1", "w1-e1"]:
    t = times[tag]
    off, on = statistics.median(t["off"]), statistics.median(t["on"])
    fo, fn = min(t["off"]), min(t["on"])
    runs = ", ".join(f"{x:.2f}" for x in t["off"]) + "; " + ", ".join(f"{x:.2f}" for x in t["on"])
    print(f"| {names[tag]} | {off:.3f} | {on:.3f} | {on / off:.3f} | {fo:.3f} | {fn:.3f} | "
          f"{fn / fo:.3f} | {runs} |")
EOF

{
  echo "# Host tier on CPU ranks ($commit, $(date -u +%F))"
  echo
  echo "Machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo), $(lscpu | sed -n 's/^Model name: *//p')."
  echo "Data: synthetic, $users users, $items items, $interactions interactions; batch $batch, $steps steps,"
  echo "--embedding_optimizer $optimizer, --lookahead_steps $lookahead, one thread per rank."
  echo
  echo "Command: bash bench/host_tier.sh --users $users --items $items --interactions $interactions --batch $batch --steps $steps --overhead_steps $overhead_steps --worlds $worlds --budgets $budgets --repeats $repeats --optimizer $optimizer --lookahead $lookahead"
  echo
  echo "## Every budget against no budget"
  echo
  cat "$out/identity.md"
  echo
  echo "## The cost of the mechanism at 100% ($overhead_steps steps, no evaluation, alternated)"
  echo
  cat "$out/overhead.md"
} >"$out/host_tier.md"
rm -f "$out"/runs/*.bin
cat "$out/host_tier.md"
