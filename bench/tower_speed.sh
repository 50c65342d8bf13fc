#!/usr/bin/env bash
# Training speed at equal quality: ncf_dist (tower GEMMs in fp32 and in bf16) against the
# PyTorch reference (bench/pytorch_neumf.py --data_dir: the same model, preset, batch,
# negatives and eval lists), one run after the other on the same prepared data and cores,
# each for the same epochs, with samples/s and HR@10 / NDCG@10 after the last epoch.
#   bash bench/tower_speed.sh                 # full: synthetic ml-1m and ml-20m shapes
#   TOWER_QUICK=1 bash bench/tower_speed.sh   # smoke test: ml-1m only, 1 epoch
# Per data shape: the ncf-paper preset at its batch (256) and the ml-20m-mlperf preset at
# batch 65,536 and 1,048,576; each as ncf_dist --precision fp32, ncf_dist --precision bf16
# and PyTorch (FP32). Both sides run all epochs (ncf_dist with --hr_threshold -1).
# Results: bench/results/tower_speed[_quick]_<date>_<commit>[+wt]/ ("+wt": src/ in the
# working tree differs from the commit; NCF_BIN may hold another build): info.txt
# (machine, commit, build, settings), log.txt (every command echoed after the load before
# it, and its output), runs.tsv and runs/*.jsonl (per-epoch JSON
# lines of each run, --metrics_json), summary.md (tables with the ratios).
# Env:
#   NCF_BIN               ncf_dist / ncf_prep directory (default build/src)
#   NCF_BENCH_DATA        where the datasets live (default /tmp: bench-ml-1m, bench-ml-20m,
#                         made when missing, shared with bench/run_cpu_benchmarks.sh)
#   TOWER_EPOCHS          epochs on ml-1m (default 3; 1 with TOWER_QUICK=1)
#   TOWER_ML20M_EPOCHS    epochs on ml-20m (default 1)
#   TOWER_ML20M_SAMPLES   training samples per epoch on ml-20m, as --max_steps = this / batch
#                         on both sides (default 20971520, a fifth of an epoch; 0: whole
#                         epochs — on 2 cores a whole epoch takes ~20 min for ncf_dist and
#                         ~40 min for PyTorch per configuration)
#   TOWER_ML20M_EVAL_USERS  eval users on ml-20m, the same seeded subset on both sides
#                         (--eval_users; default 20000 of 138,493; 0: all)
#   TOWER_THREADS         threads per run (default: nproc)
#   TOWER_QUICK           1: ml-1m only, 1 epoch
#   TOWER_ML20M_NCF_PAPER 0: skip the ncf-paper preset on ml-20m (default 1)
#   TOWER_SHAPES          the data shapes to run, of "ml-1m ml-20m" (default both; quick: ml-1m)
#   TOWER_OUT             results directory (default as above)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="$(cd "${NCF_BIN:-$root/build/src}" && pwd)"
data="${NCF_BENCH_DATA:-/tmp}"
quick="${TOWER_QUICK:-0}"
epochs="${TOWER_EPOCHS:-$([ "$quick" = 1 ] && echo 1 || echo 3)}"
epochs20="${TOWER_ML20M_EPOCHS:-1}"
samples20="${TOWER_ML20M_SAMPLES:-20971520}"
eval20="${TOWER_ML20M_EVAL_USERS:-20000}"
threads="${TOWER_THREADS:-$(nproc)}"
shapes="${TOWER_SHAPES:-$([ "$quick" = 1 ] && echo ml-1m || echo "ml-1m ml-20m")}"
py=/usr/bin/python3  # Debian's python3-torch lives here, not in a pyenv python
commit="$(git -C "$root" rev-parse --short HEAD)"
tag="$commit"
[ -n "$(git -C "$root" status --porcelain -- src)" ] && tag="$commit+wt"
kind=tower_speed
[ "$quick" = 1 ] && kind=tower_speed_quick
out="${TOWER_OUT:-$root/bench/results/${kind}_$(date -u +%F)_$tag}"
for p in ncf_dist ncf_prep; do
  [ -x "$bin/$p" ] || { echo "tower_speed: $bin/$p not found (set NCF_BIN)" >&2; exit 1; }
done
bash "$root/scripts/setup.sh" python3-torch  # the PyTorch reference's Debian package
$py -c 'import torch, numpy, google.protobuf, crcmod' 2>/dev/null || {
  echo "tower_speed: $py lacks torch, numpy, protobuf or crcmod: apt-get install -y" \
    "python3-torch python3-protobuf python3-crcmod" >&2
  exit 1
}
mkdir -p "$out/runs"
: >"$out/runs.tsv"
: >"$out/commands.txt"

header() {  # header TITLE: what every results file opens with
  echo "# $1"
  echo "# date: $(date -u +%FT%TZ)  commit: $commit" \
    "(files under src/ differing from it: $(git -C "$root" status --short -- src | wc -l))"
  echo "# machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores" \
    "($(lscpu | sed -n 's/^Thread(s) per core: *//p') threads per core)," \
    "$(free -g | awk '/^Mem:/{print $2}') GiB memory"
  echo "# binaries: $bin (ncf_dist built $(date -u -r "$bin/ncf_dist" +%FT%TZ))"
  echo "# PyTorch: $($py -c 'import torch; print(torch.__version__)') ($py)"
}
load() { echo "# load: $(cut -d' ' -f1-3 /proc/loadavg) (1/5/15 min)"; }
run() {  # run CMD...: echo the command, then run it; a failure is logged, not fatal
  load
  echo "\$ $*"
  echo "$*" >>"$out/commands.txt"
  "$@" || echo "# FAILED: exit $?"
}

# prepare NAME ARGS...: the synthetic dataset $data/bench-NAME, made when missing.
prepare() {
  local name=$1 d="$data/bench-$1"
  shift
  [ -f "$d/metadata.json" ] || run "$bin/ncf_prep" --synthetic "$name" "$@" --output "$d" \
    --progress off
}

# one DATA PRESET BATCH MAX_STEPS EVAL_USERS EPOCHS: the three runs of one configuration.
# BATCH "-" is the preset's own; MAX_STEPS and EVAL_USERS 0 mean none.
one() {
  local name=$1 preset=$2 batch=$3 steps=$4 evu=$5 ep=$6 d="$data/bench-$1"
  local common=(--data_dir "$d" --preset "$preset" --threads "$threads")
  [ "$batch" != - ] && common+=(--batch_size "$batch")
  [ "$steps" != 0 ] && common+=(--max_steps "$steps")
  [ "$evu" != 0 ] && common+=(--eval_users "$evu")
  local id="$name.$preset.b${batch/-/default}" l1 f
  for prec in fp32 bf16; do
    f="$out/runs/$id.ncf_dist_$prec.jsonl"
    rm -f "$f"
    l1=$(cut -d' ' -f1 /proc/loadavg)
    run "$bin/ncf_dist" "${common[@]}" --train_epochs "$ep" --precision "$prec" \
      --hr_threshold -1 --progress off --metrics_json "$f"
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$preset" "$batch" "ncf_dist $prec" "$l1" \
      "$(basename "$f")" >>"$out/runs.tsv"
  done
  f="$out/runs/$id.pytorch.jsonl"
  rm -f "$f"
  l1=$(cut -d' ' -f1 /proc/loadavg)
  run $py "$root/bench/pytorch_neumf.py" "${common[@]}" --epochs "$ep" --metrics_json "$f"
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$preset" "$batch" "pytorch fp32" "$l1" \
    "$(basename "$f")" >>"$out/runs.tsv"
}

{
  header "tower_speed: ncf_dist fp32 / bf16 against PyTorch NeuMF on the same data"
  echo "# settings: quick=$quick shapes=$shapes threads=$threads ml-1m epochs=$epochs" \
    "ml-20m epochs=$epochs20 ml-20m samples/epoch=$samples20 ml-20m eval users=$eval20" \
    "data=$data"
  echo "# lscpu:"
  lscpu | sed -n -E '/^(Architecture|CPU\(s\)|Model name|Thread|Core|Socket|L[123]|Flags)/p' |
    cut -c1-200 | sed 's/^/#   /'
} >"$out/info.txt"

{
  cat "$out/info.txt"
  if [[ " $shapes " == *" ml-1m "* ]]; then
    prepare ml-1m --eval_negatives 99
    for cfg in "ncf-paper -" "ml-20m-mlperf 65536" "ml-20m-mlperf 1048576"; do
      read -r preset batch <<<"$cfg"
      one ml-1m "$preset" "$batch" 0 0 "$epochs"
    done
  fi
  if [[ " $shapes " == *" ml-20m "* ]]; then
    prepare ml-20m
    # The preset's batch is 256 for ncf-paper: what its step cap is computed from.
    configs=("ml-20m-mlperf 65536 65536" "ml-20m-mlperf 1048576 1048576")
    # ncf-paper's dense Adam touches every table row at each of its many small steps
    # (~40k samples/s here, PyTorch slower still): on only when asked.
    [ "${TOWER_ML20M_NCF_PAPER:-1}" = 1 ] && configs=("ncf-paper - 256" "${configs[@]}")
    for cfg in "${configs[@]}"; do
      read -r preset batch samples_per_step <<<"$cfg"
      steps=0
      [ "$samples20" != 0 ] && steps=$(((samples20 + samples_per_step - 1) / samples_per_step))
      one ml-20m "$preset" "$batch" "$steps" "$eval20" "$epochs20"
    done
  fi
  load
} 2>&1 | tee "$out/log.txt"
load >>"$out/info.txt"

# The tables: samples/s over all epochs (their samples / their train seconds, each epoch's
# start and negative sampling included on both sides) and the last epoch's HR@10 / NDCG@10.
$py - "$out" <<'EOF' | tee "$out/summary.md"
import json, os, sys
out = sys.argv[1]
rows = []
for line in open(os.path.join(out, "runs.tsv")):
    data, preset, batch, side, load1, f = line.rstrip("\n").split("\t")
    ep = []
    path = os.path.join(out, "runs", f)
    if os.path.exists(path):
        ep = [json.loads(x) for x in open(path) if x.strip()]
    rows.append(dict(data=data, preset=preset, batch=batch, side=side, load=load1, ep=ep))
def sps(r):
    s = sum(e["train_seconds"] for e in r["ep"])
    return sum(e["samples"] for e in r["ep"]) / s if s else None
def f0(x):
    return "" if x is None else f"{x:,.0f}"
def f4(x):
    return "" if x is None else f"{x:.4f}"
print("| data | preset | batch | run | epochs x steps | samples/s (all epochs) "
      "| samples/s (last epoch) | HR@10 | NDCG@10 | train s | load1 at start |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for r in rows:
    ep = r["ep"]
    if not ep:
        print(f"| {r['data']} | {r['preset']} | {r['batch']} | {r['side']} | FAILED "
              f"| | | | | | {r['load']} |")
        continue
    last = ep[-1]
    print(f"| {r['data']} | {r['preset']} | {r['batch']} | {r['side']} "
          f"| {len(ep)} x {last['steps']} | {f0(sps(r))} | {f0(last['samples_per_second'])} "
          f"| {f4(last['hr'])} | {f4(last['ndcg'])} "
          f"| {sum(e['train_seconds'] for e in ep):.1f} | {r['load']} |")
print()
print("| data | preset | batch | ncf_dist fp32 / PyTorch | bf16 / fp32 | HR@10 fp32 - PyTorch "
      "| HR@10 bf16 - fp32 |")
print("| --- | --- | --- | --- | --- | --- | --- |")
keys = []
for r in rows:
    k = (r["data"], r["preset"], r["batch"])
    if k not in keys:
        keys.append(k)
for k in keys:
    by = {r["side"]: r for r in rows if (r["data"], r["preset"], r["batch"]) == k and r["ep"]}
    def ratio(a, b):
        return (f"{sps(by[a]) / sps(by[b]):.2f}x" if a in by and b in by and sps(by[b])
                else "")
    def dhr(a, b):
        return f"{by[a]['ep'][-1]['hr'] - by[b]['ep'][-1]['hr']:+.4f}" if a in by and b in by else ""
    print(f"| {k[0]} | {k[1]} | {k[2]} | {ratio('ncf_dist fp32', 'pytorch fp32')} "
          f"| {ratio('ncf_dist bf16', 'ncf_dist fp32')} | {dhr('ncf_dist fp32', 'pytorch fp32')} "
          f"| {dhr('ncf_dist bf16', 'ncf_dist fp32')} |")
print()
print("batch -: the preset's own (256). samples/s: the run's samples over its train seconds "
      "(each epoch from its start to its last step: reader / negative sampling included on "
      "both sides, evaluation excluded). HR@10, NDCG@10: after the last epoch.")
EOF
