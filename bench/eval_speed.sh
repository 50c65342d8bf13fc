#!/usr/bin/env bash
# Evaluation speed, side by side in one run: ncf_dist's evaluation by items (each item's
# half of layer 0 once per evaluation, read by id per candidate) against the per-sample
# path (--eval_scoring per_sample: every candidate's item rows looked up and multiplied), under
# each precision, on the same prepared data, users, cores and binary, alternating so that
# a drift of the machine falls on both. One training step first (the evaluation scores
# the same parameters either way), then one evaluation of --eval_users users.
#   bash bench/eval_speed.sh [--data DIR] [--users N] [--reps R] [--threads T]
#                            [--batch B] [--device cpu|cuda] [--out DIR]
# --data: an ncf_prep directory (default /tmp/bench-ml-20m, made with ncf_prep --synthetic
# ml-20m when missing); --users 3000; --reps 3 (the median is reported); --threads: nproc;
# --batch: --eval_batch_size (100000); --out: bench/results/eval_speed_<date>_<commit>/.
# Writes info.txt, log.txt (every command and its output), runs.tsv and summary.md.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=bench/lib.sh
source "$root/bench/lib.sh"
die() { echo "eval_speed: $*" >&2; exit 1; }

data=/tmp/bench-ml-20m users=3000 reps=3 threads=$(nproc) batch=100000 device=cpu out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --data) data=$2; shift 2 ;;
    --users) users=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --device) device=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) die "unknown argument '$1' (--data, --users, --reps, --threads, --batch, --device, --out)" ;;
  esac
done
bench_positive_ints users reps threads batch
case "$device" in cpu | cuda) ;; *) die "--device '$device' must be cpu or cuda" ;; esac
bench_programs "${NCF_BUILD_DIR:-$root/build}"
commit=$(bench_commit "$root")
[ -n "$out" ] || out="$root/bench/results/eval_speed_$(date -u +%F)_$commit"
mkdir -p "$out"
if [ ! -f "$data/metadata.json" ]; then
  "$prep" --synthetic ml-20m --output "$data" --progress off >/dev/null
fi
{
  echo "date: $(date -u +%FT%TZ)"
  echo "commit: $commit"
  echo "machine: $(nproc) cores, $(free -g | awk '/^Mem:/{print $2}') GiB, $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -n 1)"
  echo "data: $data; device $device; $users eval users; --eval_batch_size $batch; $threads threads; $reps reps (median)"
} >"$out/info.txt"
: >"$out/log.txt"
printf 'precision\tpath\trep\teval_s\thr\tndcg\n' >"$out/runs.tsv"
for rep in $(seq 1 "$reps"); do
  for p in fp32 bf16; do
    for path in per_sample by_items; do
      scoring=auto
      [ "$path" = by_items ] || scoring=per_sample
      m="$out/m.jsonl"
      rm -f "$m"
      cmd=("$dist" --eval_scoring "$scoring" --data_dir "$data" --preset ml-20m-mlperf
        --device "$device" --threads "$threads" --precision "$p" --max_steps 1 --train_epochs 1
        --eval_users "$users" --eval_batch_size "$batch" --hr_threshold -1 --progress off
        --metrics_json "$m")
      echo "\$ ${cmd[*]}" >>"$out/log.txt"
      "${cmd[@]}" >>"$out/log.txt" 2>&1 || die "a run failed: see $out/log.txt"
      python3 - "$m" "$p" "$path" "$rep" >>"$out/runs.tsv" <<'EOF'
import json, sys
j = json.loads(open(sys.argv[1]).read().splitlines()[-1])
print(f"{sys.argv[2]}\t{sys.argv[3]}\t{sys.argv[4]}\t{j['eval_seconds']:.3f}\t{j['hr']}\t{j['ndcg']:.6f}")
EOF
    done
  done
done
rm -f "$out/m.jsonl"
python3 - "$out/runs.tsv" "$users" >"$out/summary.md" <<'EOF'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
print(f"# One evaluation of {sys.argv[2]} users: per-sample path against evaluation by items\n")
print("| precision | per-sample s | by items s | speed-up | HR@10 per-sample / by items |")
print("| --- | ---: | ---: | ---: | --- |")
for p in ("fp32", "bf16"):
    t = {k: statistics.median(float(r["eval_s"]) for r in rows if r["precision"] == p and r["path"] == k)
         for k in ("per_sample", "by_items")}
    hr = {k: next(r["hr"] for r in rows if r["precision"] == p and r["path"] == k)
          for k in ("per_sample", "by_items")}
    print(f"| {p} | {t['per_sample']:.3f} | {t['by_items']:.3f} | {t['per_sample'] / t['by_items']:.2f}x "
          f"| {hr['per_sample']} / {hr['by_items']} |")
EOF
cat "$out/summary.md"
