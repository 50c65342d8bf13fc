#!/usr/bin/env bash
# Delta exports for serving (ncf_export --since): the rows and bytes of a delta between two
# checkpoints against the full NumPy export, per --embedding_optimizer. For each optimizer
# and each distance A in --apart, one CPU rank trains the same synthetic dataset for --steps
# steps (about one epoch by default, so that dense Adam's moments are non-zero on nearly
# every row, as in a long run) with checkpoints at steps - A and at the end (the training is
# deterministic, so step `steps` is the same for every A); the delta between the two is
# written, applied to the older full export, and the result compared with the newer full
# export (cmp of every file: a wrong delta stops the record).
#
#   bash bench/export_delta.sh [--users 200000] [--items 20000] [--interactions 2000000]
#        [--optimizers dense_adam,lazy_adam,adagrad] [--steps 2000] [--apart 1,10]
#        [--batch_size 4096] [--out DIR] [--data DIR] [--work DIR]
#
# Writes OUT/settings.txt, OUT/runs/<optimizer>.log (training, exports, deltas, applies),
# OUT/runs.tsv and OUT/export_delta.md; the checkpoints and exports go to WORK (removed at
# the end). Not a test.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
prog=export_delta.sh
die() { echo "$prog: $*" >&2; exit 1; }
command_line="bash bench/export_delta.sh $*"

users=200000
items=20000
interactions=2000000
optimizers=dense_adam,lazy_adam,adagrad
steps=2000
apart=1,10
batch=4096
# shellcheck source=bench/lib.sh
source "$root/bench/lib.sh"
commit=$(bench_commit "$root")
out="$root/bench/results/export_delta_$(date -u +%F)_$commit"
data=""
work=""
while [ $# -gt 0 ]; do
  case "$1" in
    --users) users="$2"; shift 2 ;;
    --items) items="$2"; shift 2 ;;
    --interactions) interactions="$2"; shift 2 ;;
    --optimizers) optimizers="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --apart) apart="$2"; shift 2 ;;
    --batch_size) batch="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --data) data="$2"; shift 2 ;;
    --work) work="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
done
bench_positive_ints users items interactions steps batch
[[ "$optimizers" =~ ^[a-z_]+(,[a-z_]+)*$ ]] || die "--optimizers '$optimizers' is not a comma-separated list"
[[ "$apart" =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] || die "--apart '$apart' is not a comma-separated list of positive integers"
IFS=, read -r -a OPTIMIZERS <<<"$optimizers"
IFS=, read -r -a APART <<<"$apart"
for a in "${APART[@]}"; do
  # One checkpoint every steps - A steps, then the last: exactly two when 2 A <= steps.
  [ $((2 * a)) -le "$steps" ] || die "--apart $a must be at most half of --steps $steps"
done
data="${data:-/var/tmp/ncf-bench/u${users}-i${items}-n${interactions}}"
work="${work:-$(mktemp -d /var/tmp/ncf-export-delta.XXXXXX)}"
trap 'rm -rf "$work"' EXIT

build="${NCF_BUILD_DIR:-$root/build}"
bench_programs "$build"  # sets dist, prep
export_bin="$build/src/ncf_export"
[ -x "$export_bin" ] || die "no ncf_export in $build/src (build the ncf_export target)"
mkdir -p "$out/runs" "$work"
if [ ! -f "$data/metadata.json" ]; then
  mkdir -p "$(dirname "$data")"
  "$prep" --synthetic custom --users "$users" --items "$items" --interactions "$interactions" \
    --min_per_user 2 --eval_negatives 1 --output "$data" --progress off >"$out/prep.log" 2>&1 ||
    { cat "$out/prep.log" >&2; die "ncf_prep failed"; }
fi
{
  echo "date: $(date -u +%FT%TZ)"
  echo "commit: $commit (programs: $build)"
  echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, $(free -g | awk '/^Mem:/{print $2}') GiB"
  echo "command: $command_line"
  echo "data: $data ($users users, $items items, $interactions interactions)"
  echo "settings: optimizers $optimizers, $steps steps of batch $batch (one CPU rank, 2 threads, default model); deltas from step $steps - A to step $steps for A in $apart"
} >"$out/settings.txt"

# The wall seconds of a command, its output appended to the log.
timed() {  # LOG COMMAND...
  local log="$1" t0 t1
  shift
  t0=$(date +%s.%N)
  "$@" >>"$log" 2>&1 || { tail -5 "$log" >&2; die "failed: $*"; }
  t1=$(date +%s.%N)
  awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }'
}

printf 'optimizer\tapart\tuser_rows\tuser_changed\tuser_new\titem_rows\titem_changed\titem_new\tdelta_bytes\tfull_bytes\tdelta_s\tapply_s\n' >"$out/runs.tsv"
for o in "${OPTIMIZERS[@]}"; do
  log="$out/runs/$o.log"
  : >"$log"
  for a in "${APART[@]}"; do
    ck="$work/ck"
    echo "$prog: $o: training $steps steps, checkpoints at $((steps - a)) and $steps" >&2
    rm -rf "$ck" "$work/old" "$work/new" "$work/delta" "$work/applied"
    timed "$log" "$dist" --device cpu --threads 2 --data_dir "$data" --batch_size "$batch" \
      --max_steps "$steps" --train_epochs 1 --no_eval --progress off --embedding_optimizer "$o" \
      --checkpoint_dir "$ck" --checkpoint_every_steps $((steps - a)) --keep_checkpoints 2 >/dev/null
    older="$ck/$(printf 'step-%012d' $((steps - a)))"
    newer="$ck/$(printf 'step-%012d' "$steps")"
    { [ -d "$older" ] && [ -d "$newer" ]; } ||
      die "$o: no checkpoints at steps $((steps - a)) and $steps in $ck (is --steps past one epoch?)"
    timed "$log" "$export_bin" --checkpoint "$older" --format npy --output "$work/old" >/dev/null
    timed "$log" "$export_bin" --checkpoint "$newer" --format npy --output "$work/new" >/dev/null
    delta_s=$(timed "$log" "$export_bin" --checkpoint "$newer" --format npy --output "$work/delta" \
      --since "$older")
    apply_s=$(timed "$log" "$export_bin" --apply "$work/delta" --base "$work/old" \
      --output "$work/applied")
    for f in "$work/new"/*; do
      cmp -s "$f" "$work/applied/$(basename "$f")" ||
        die "$o, $a apart: $(basename "$f") of the applied delta differs from the full export"
    done
    [ "$(find "$work/applied" -type f | wc -l)" -eq "$(find "$work/new" -type f | wc -l)" ] ||
      die "$o, $a apart: the applied delta has other files than the full export"
    echo "# $o, $a step(s) apart: the applied delta equals the full export (every file)" >>"$log"
    python3 - "$work/delta" "$o" "$a" "$delta_s" "$apply_s" >>"$out/runs.tsv" <<'PY'
import json, os, sys
d, o, a, delta_s, apply_s = sys.argv[1:6]
m = json.load(open(os.path.join(d, "manifest.json")))
u, i = m["tables"]["user"], m["tables"]["item"]
size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
print("\t".join(str(x) for x in (o, a, u["rows"], u["changed"], u["new"], i["rows"], i["changed"],
                                 i["new"], size, m["full_export_bytes"], delta_s, apply_s)))
PY
  done
done

python3 - "$out" <<'PY'
import os, sys
out = sys.argv[1]
md = ["# Delta exports: rows and bytes against the full NumPy export", "", "```",
      open(os.path.join(out, "settings.txt")).read().rstrip(), "```", "",
      "| optimizer | steps apart | user rows in the delta | item rows in the delta | "
      "delta bytes | full export bytes | delta / full | write delta (s) | apply (s) |",
      "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
lines = open(os.path.join(out, "runs.tsv")).read().split("\n")[1:]
for line in filter(None, lines):
    o, a, ur, uc, un, ir, ic, inew, db, fb, ds, aps = line.split("\t")
    ud, idl = int(uc) + int(un), int(ic) + int(inew)
    md.append(f"| {o} | {a} | {ud:,} of {int(ur):,} ({100 * ud / int(ur):.1f}%) | "
              f"{idl:,} of {int(ir):,} ({100 * idl / int(ir):.1f}%) | {int(db):,} | {int(fb):,} | "
              f"{100 * int(db) / int(fb):.1f}% | {ds} | {aps} |")
md += ["", "Every delta was applied to the older full export and the result compared with the "
       "newer full export, file by file (cmp): all equal."]
open(os.path.join(out, "export_delta.md"), "w").write("\n".join(md) + "\n")
print("\n".join(md))
PY
