#!/usr/bin/env bash
# Per-rank memory of the embedding tables, estimated and measured, for one rank holding a
# 10^7-user synthetic table: each --embedding_optimizer (with +bf16: --table_dtype bf16,
# BF16 rows) runs a few training
# steps without evaluation; the plan line's estimate (tables with their optimizer state,
# then the whole rank) is put beside the process's peak resident set (getrusage of the
# child), and the table bytes per row are derived from the estimate.
#
#   bash bench/table_memory.sh [--users 10000000] [--items 20000] [--interactions 20000000]
#        [--options dense_adam,rowwise_adagrad,rowwise_adagrad+bf16] [--steps 2] [--out DIR]
#        [--data DIR]
#
# Writes OUT/runs/<option>.log and OUT/table_memory.md. Not a test.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
prog=table_memory.sh
die() { echo "$prog: $*" >&2; exit 1; }

users=10000000
items=20000
interactions=20000000
options=dense_adam,rowwise_adagrad,dense_adam+bf16,rowwise_adagrad+bf16
steps=2
# shellcheck source=bench/lib.sh
source "$root/bench/lib.sh"
commit=$(bench_commit "$root")
out="$root/bench/results/table_memory_$(date -u +%F)_$commit"
data=""
while [ $# -gt 0 ]; do
  case "$1" in
    --users) users="$2"; shift 2 ;;
    --items) items="$2"; shift 2 ;;
    --interactions) interactions="$2"; shift 2 ;;
    --options) options="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --data) data="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
done
bench_positive_ints users items interactions steps
[[ "$options" =~ ^[a-z_0-9+]+(,[a-z_0-9+]+)*$ ]] || die "--options '$options' is not a comma-separated list"
IFS=, read -r -a OPTIONS <<<"$options"
data="${data:-/var/tmp/ncf-bench/u${users}-i${items}}"

build="${NCF_BUILD_DIR:-$root/build}"
bench_programs "$build"  # sets dist, prep
mkdir -p "$out/runs"
if [ ! -f "$data/metadata.json" ]; then
  mkdir -p "$(dirname "$data")"
  "$prep" --synthetic custom --users "$users" --items "$items" --interactions "$interactions" \
    --min_per_user 2 --eval_negatives 1 --output "$data" --progress off >"$out/prep.log" 2>&1 ||
    { cat "$out/prep.log" >&2; die "ncf_prep failed"; }
fi
{
  echo "date: $(date -u +%FT%TZ)"
  echo "commit: $commit (ncf_dist: $build)"
  echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, $(free -g | awk '/^Mem:/{print $2}') GiB"
  echo "data: $data ($users users, $items items, $interactions interactions)"
  echo "settings: options $options, $steps steps, one CPU rank, --preset ncf-paper --batch_size 65536"
} >"$out/settings.txt"

: >"$out/runs.tsv"
for o in "${OPTIONS[@]}"; do
  # option: an optimizer name, optionally +bf16 (BF16 rows)
  opt=${o%%+*}
  flags=(--embedding_optimizer "$opt")
  [ "$o" = "$opt" ] || flags+=(--table_dtype "${o#*+}")
  echo "$prog: $o: ${flags[*]}" >&2
  python3 - "$out/runs/$o.log" "$dist" --device cpu --data_dir "$data" --preset ncf-paper \
    --batch_size 65536 --max_steps "$steps" --train_epochs 1 --no_eval --threads 2 \
    --progress off "${flags[@]}" <<'PY'
import resource, subprocess, sys
log = sys.argv[1]
with open(log, "w") as f:
    rc = subprocess.call(sys.argv[2:], stdout=f, stderr=subprocess.STDOUT)
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # KiB on Linux
    f.write(f"# exit {rc}; peak resident set {peak} KiB\n")
sys.exit(rc)
PY
  echo "$o	${flags[*]}" >>"$out/runs.tsv"
done

python3 - "$out" "$users" <<'PY'
import os, re, sys
out, users = sys.argv[1], int(sys.argv[2])
md = ["# Embedding tables: estimated and measured memory of one rank", "", "```",
      open(os.path.join(out, "settings.txt")).read().rstrip(), "```", "",
      "| option | flags | user table (estimate) | bytes per user row | rank estimate | peak RSS | RSS / estimate |",
      "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
base = None
for line in open(os.path.join(out, "runs.tsv")):
    o, flags = line.rstrip("\n").split("\t")
    log = open(os.path.join(out, "runs", o + ".log")).read()
    t = re.search(r"user table row \(([0-9.]+) MiB\)", log)
    e = re.search(r"estimated memory ([0-9.]+) MiB", log)
    r = re.search(r"peak resident set ([0-9]+) KiB", log)
    ut = float(t.group(1)) * 2**20 if t else float("nan")
    est = float(e.group(1)) if e else float("nan")
    rss = int(r.group(1)) / 1024 if r else float("nan")
    per_row = ut / users
    base = base or per_row
    md.append(f"| {o} | `{flags}` | {ut / 2**20:.1f} MiB | {per_row:.1f} ({per_row / base:.2f}x) | "
              f"{est:.1f} MiB | {rss:.1f} MiB | {rss / est:.2f} |")
open(os.path.join(out, "table_memory.md"), "w").write("\n".join(md) + "\n")
print("\n".join(md))
PY
